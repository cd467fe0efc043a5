//! Every subcommand's `--help` shows at least one example line (a line starting with the
//! program's name under an "Example" heading), found by walking the commands `--help` lists.

fn help(path: &[String]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_minirun"))
        .args(path)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{path:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists under "Commands:", `help` left out.
fn subcommands(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_subcommand_shows_an_example() {
    let mut todo: Vec<Vec<String>> = subcommands(&help(&[]))
        .into_iter()
        .map(|c| vec![c])
        .collect();
    assert!(todo.len() >= 10, "{todo:?}");
    while let Some(path) = todo.pop() {
        let text = help(&path);
        let example = text
            .lines()
            .skip_while(|l| !l.starts_with("Example"))
            .any(|l| l.trim_start().starts_with("minirun "));
        assert!(
            example,
            "minirun {} --help has no example:\n{text}",
            path.join(" ")
        );
        for sub in subcommands(&text) {
            todo.push([path.clone(), vec![sub]].concat());
        }
    }
}
