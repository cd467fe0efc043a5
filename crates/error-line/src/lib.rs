//! An error and its causes as one line, each said once. Many of the workspace's errors carry
//! their cause's text in their own message (so that they read whole when shown alone) and also
//! return it as their `source()`; printing the chain as it is (`{:#}`) then repeats a path or
//! an OS error two or three times.

/// `err`'s chain joined with ": ", leaving out a cause whose text the line already holds, and
/// the head of a cause that repeats what the line ends with (`cannot open a.bin` then
/// `a.bin: No such file` reads `cannot open a.bin: No such file`).
pub fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        let rest = &text[repeated_head(&line, &text)..];
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(rest);
    }
    line
}

/// How many leading bytes of `text` (a head ending before one of its ": ") the line already
/// ends with as a whole word; 0 when none.
fn repeated_head(line: &str, text: &str) -> usize {
    text.match_indices(": ")
        .map(|(at, _)| at)
        .filter(|&at| at > 0 && line.ends_with(&text[..at]))
        .filter(|&at| {
            let before = &line[..line.len() - at];
            before.is_empty() || before.ends_with(' ')
        })
        .last()
        .map_or(0, |at| at + 2)
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct Unreadable {
        path: String,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once_and_others_are_kept() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let err = Err::<(), _>(Unreadable {
            path: "model/config.json".into(),
            source: io,
        })
        .context("cannot pack model into out")
        .unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            "cannot pack model into out: model/config.json: No such file or directory: No such file or directory"
        );
        assert_eq!(
            one_line(&err),
            "cannot pack model into out: model/config.json: No such file or directory"
        );
    }

    #[test]
    fn a_cause_that_starts_with_what_the_line_ends_with_keeps_only_its_news() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let err = Err::<(), _>(Unreadable {
            path: "runs/latest.bin".into(),
            source: io,
        })
        .context("cannot export runs/latest.bin")
        .unwrap_err();
        assert_eq!(
            one_line(&err),
            "cannot export runs/latest.bin: No such file or directory"
        );
    }

    #[test]
    fn a_head_that_only_ends_a_longer_word_of_the_line_is_kept() {
        let err = anyhow::anyhow!("x.bin: too short").context("cannot export latex.bin");
        assert_eq!(one_line(&err), "cannot export latex.bin: x.bin: too short");
    }
}
