//! Reading a training log into the curves a chart draws. The log is the JSON Lines file
//! `dormouse train --log` appends to (its lines are listed in `dormouse::training_run`); a
//! resumed run appends to the same file and logs again the steps after its last save, so a
//! step's last line is the one that counts.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The curves of one run, by steps done.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Curves {
    /// Each step's training loss in bits per byte (over that step's batch).
    pub train: Vec<(u64, f64)>,
    /// Held-out bits per byte of the model, and of its EMA teacher, at each evaluation.
    pub held_out: Vec<(u64, f64)>,
    pub teacher: Vec<(u64, f64)>,
    /// Each step's learning rate.
    pub learning_rate: Vec<(u64, f64)>,
    /// What the compressors make of the held-out bytes, in bits per byte: the last
    /// `baselines` line's (every start of a run measures the same bytes).
    pub baselines: Option<Baselines>,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Baselines {
    pub gzip_9: f64,
    pub xz_9: f64,
    pub zstd_19: f64,
}

/// Why a log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(
        "line {line} is not a line of a dormouse training log ({reason}); give the file `dormouse train --log` wrote"
    )]
    Line { line: usize, reason: String },
    #[error(
        "the log has no step yet: nothing to plot (a run logs a line after each step once it has started)"
    )]
    NoSteps,
}

/// One line of the log: exactly one of these shapes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Line {
    Step {
        step: u64,
        loss: f64,
        lr: f64,
        #[allow(dead_code)]
        grad_norm: f64,
        #[allow(dead_code)]
        tokens_per_s: f64,
    },
    Eval {
        eval: Eval,
    },
    Baselines {
        baselines: Baselines,
    },
    Startup {
        #[allow(dead_code)]
        startup_s: f64,
    },
}

#[derive(Debug, Deserialize)]
struct Eval {
    step: u64,
    bpb: f64,
    ema_bpb: f64,
}

/// The curves of the log `text`. A last line without its newline that does not parse is a
/// line still being written by a running training, and is left out; any other line that is
/// not one the log holds is refused, naming it.
pub fn read(text: &str) -> Result<Curves, LogError> {
    let mut steps: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    let mut evals: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    let mut baselines = None;
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    for (index, raw) in lines.iter().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let line = match serde_json::from_str::<Line>(raw) {
            Ok(line) => line,
            Err(_) if !complete && index + 1 == lines.len() => break,
            Err(e) => {
                return Err(LogError::Line {
                    line: index + 1,
                    reason: e.to_string(),
                });
            }
        };
        match line {
            // `step` is the step's index; the curves are by steps done, as evaluations are.
            Line::Step { step, loss, lr, .. } => {
                steps.insert(step + 1, (loss / std::f64::consts::LN_2, lr));
            }
            Line::Eval { eval } => {
                evals.insert(eval.step, (eval.bpb, eval.ema_bpb));
            }
            Line::Baselines { baselines: b } => baselines = Some(b),
            Line::Startup { .. } => {}
        }
    }
    if steps.is_empty() {
        return Err(LogError::NoSteps);
    }
    Ok(Curves {
        train: steps.iter().map(|(&s, &(bpb, _))| (s, bpb)).collect(),
        learning_rate: steps.iter().map(|(&s, &(_, lr))| (s, lr)).collect(),
        held_out: evals.iter().map(|(&s, &(bpb, _))| (s, bpb)).collect(),
        teacher: evals.iter().map(|(&s, &(_, ema))| (s, ema)).collect(),
        baselines,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"startup_s":0.5}
{"baselines":{"gzip_9":2.9,"xz_9":2.6,"zstd_19":2.7,"order0_entropy":4.5}}
{"step":0,"loss":5.545177444479562,"lr":0.001,"grad_norm":1.0,"tokens_per_s":100.0}
{"step":1,"loss":4.1588830833596715,"lr":0.002,"grad_norm":1.0,"tokens_per_s":100.0}
{"eval":{"step":2,"bpb":5.5,"ema_bpb":7.5}}
"#;

    #[test]
    fn steps_are_counted_as_steps_done_and_losses_become_bits() {
        let c = read(LOG).unwrap();
        assert_eq!(c.train.len(), 2);
        assert_eq!(c.train[0].0, 1);
        assert!((c.train[0].1 - 8.0).abs() < 1e-12);
        assert!((c.train[1].1 - 6.0).abs() < 1e-12);
        assert_eq!(c.learning_rate, [(1, 0.001), (2, 0.002)]);
        assert_eq!(c.held_out, [(2, 5.5)]);
        assert_eq!(c.teacher, [(2, 7.5)]);
        assert_eq!(c.baselines.map(|b| b.xz_9), Some(2.6));
    }

    #[test]
    fn a_resumed_run_s_later_lines_replace_the_steps_it_logged_again() {
        let resumed = format!(
            "{LOG}{}",
            r#"{"step":1,"loss":2.772588722239781,"lr":0.002,"grad_norm":1.0,"tokens_per_s":1.0}
"#
        );
        let c = read(&resumed).unwrap();
        assert_eq!(c.train.len(), 2);
        assert!((c.train[1].1 - 4.0).abs() < 1e-12);
    }

    #[test]
    fn a_half_written_last_line_is_left_out_and_a_bad_line_elsewhere_is_named() {
        let cut = format!("{LOG}{{\"step\":2,\"lo");
        assert_eq!(read(&cut).unwrap().train.len(), 2);
        let bad = LOG.replace("{\"startup_s\":0.5}", "{\"something\":1}");
        match read(&bad) {
            Err(LogError::Line { line: 1, .. }) => {}
            other => panic!("{other:?}"),
        }
        let cut_then_more = format!("{{\"step\":2,\"lo\n{LOG}");
        assert!(matches!(
            read(&cut_then_more),
            Err(LogError::Line { line: 1, .. })
        ));
    }

    #[test]
    fn a_log_without_steps_has_nothing_to_plot() {
        assert!(matches!(
            read("{\"startup_s\":0.5}\n"),
            Err(LogError::NoSteps)
        ));
    }
}
