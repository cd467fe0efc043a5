//! What each command says about a file that is not there: the path and the OS's reason, each
//! once, on one line, with a non-zero exit.

mod common;

#[test]
fn every_command_names_a_missing_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str], &str); 5] = [
        ("export", &["info", "gone.dmexp"], "gone.dmexp"),
        ("export", &["run", "--ckpt-dir", "gone"], "gone/latest.bin"),
        (
            "generate",
            &["--export", "gone.dmexp", "--prompt", "x"],
            "gone.dmexp",
        ),
        ("serve", &["--export", "gone.dmexp"], "gone.dmexp"),
        ("train", &["--data", "gone.txt", "--steps", "1"], "gone.txt"),
    ];
    for (command, args, path) in cases {
        let out = common::run(dir.path(), command, args);
        let said = common::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{command} {args:?}: {said}");
        assert_eq!(said.matches(path).count(), 1, "{command} {args:?}: {said}");
        assert_eq!(
            said.matches("No such file or directory").count(),
            1,
            "{command} {args:?}: {said}"
        );
        assert_eq!(
            said.trim_end().lines().count(),
            1,
            "{command} {args:?}: {said}"
        );
    }
}
