//! Recognising what a file is from its first bytes, so that a refusal can name the
//! file and the command that handles it instead of saying only "bad magic".

use std::borrow::Cow;
use std::fmt;
use std::path::Path;

use crate::layout::MAGIC;

/// The first eight bytes of a dormouse training checkpoint (`<name>.bin`). Its own
/// version follows in the checkpoint header. Defined here so that every reader of an
/// export can name a checkpoint handed to it by mistake.
pub const TRAINING_CHECKPOINT_MAGIC: &[u8; 8] = b"DMTRAIN\0";

/// The first eight bytes of a dormouse Engram sidecar (`<name>.ngram`, `--engram-ram` runs).
pub const ENGRAM_SIDECAR_MAGIC: &[u8; 8] = b"DMNGRAM\0";

/// The first eight bytes of a training checkpoint written by the original (burn-based)
/// dormouse: `DMCK` and container version 2.
pub const ORIGINAL_CHECKPOINT_MAGIC: &[u8; 8] = b"DMCK\0\x02\0\0";

/// The first four bytes of a GGUF (llama.cpp) file.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// The first four bytes of a zip archive (PyTorch `.pt` / `.pth` files are zips).
pub const ZIP_MAGIC: &[u8; 4] = b"PK\x03\x04";

/// Safetensors refuses headers above 100 MB; a length beyond that is not one.
const SAFETENSORS_MAX_HEADER: u64 = 100 * 1000 * 1000;

/// What a file appears to be, judged from its first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileKind {
    /// A `.dmexp` export of the given version byte (known or not).
    Export { version: u8 },
    /// A dormouse training checkpoint (`<name>.bin`): a run, not a model.
    TrainingCheckpoint,
    /// The host-RAM Engram memory of an `--engram-ram` run (`<name>.ngram`).
    EngramSidecar,
    /// A checkpoint of the original burn-based dormouse, which this repository cannot read.
    OriginalCheckpoint,
    /// A minirun tile container.
    TileContainer,
    /// A safetensors file.
    Safetensors,
    /// A GGUF file.
    Gguf,
    /// A zip archive, e.g. a PyTorch checkpoint.
    Zip,
    /// Fewer bytes than any magic needs.
    TooShort { len: usize },
    /// Nothing recognised; holds the first (up to) eight bytes.
    Unknown { first_bytes: Vec<u8> },
}

/// Says what `bytes` (the start of a file; 24 bytes are enough) appear to be.
pub fn identify(bytes: &[u8]) -> FileKind {
    let starts = |magic: &[u8]| bytes.starts_with(magic);
    if let (true, Some(&version)) = (starts(MAGIC), bytes.get(7)) {
        return FileKind::Export { version };
    }
    if starts(TRAINING_CHECKPOINT_MAGIC) {
        return FileKind::TrainingCheckpoint;
    }
    if starts(ENGRAM_SIDECAR_MAGIC) {
        return FileKind::EngramSidecar;
    }
    if starts(ORIGINAL_CHECKPOINT_MAGIC) {
        return FileKind::OriginalCheckpoint;
    }
    // minirun's own constant: a new container magic there is recognised here without a copy
    // to forget.
    if starts(minirun_format::tile::MAGIC) {
        return FileKind::TileContainer;
    }
    if starts(GGUF_MAGIC) {
        return FileKind::Gguf;
    }
    if starts(ZIP_MAGIC) {
        return FileKind::Zip;
    }
    if looks_like_safetensors(bytes) {
        return FileKind::Safetensors;
    }
    if bytes.len() < 8 {
        return FileKind::TooShort { len: bytes.len() };
    }
    FileKind::Unknown {
        first_bytes: bytes.iter().take(8).copied().collect(),
    }
}

/// Safetensors starts with a u64 LE header length followed by the JSON header's `{`.
fn looks_like_safetensors(bytes: &[u8]) -> bool {
    let Some(len_bytes) = bytes.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
        return false;
    };
    let header_len = u64::from_le_bytes(len_bytes);
    (2..=SAFETENSORS_MAX_HEADER).contains(&header_len) && bytes.get(8) == Some(&b'{')
}

impl FileKind {
    /// A short stable name for scripts (`--json` output).
    pub fn label(&self) -> &'static str {
        match self {
            FileKind::Export { .. } => "dmexp-export",
            FileKind::TrainingCheckpoint => "dormouse-training-checkpoint",
            FileKind::EngramSidecar => "dormouse-engram-sidecar",
            FileKind::OriginalCheckpoint => "original-dormouse-checkpoint",
            FileKind::TileContainer => "tile-container",
            FileKind::Safetensors => "safetensors",
            FileKind::Gguf => "gguf",
            FileKind::Zip => "zip",
            FileKind::TooShort { .. } => "too-short",
            FileKind::Unknown { .. } => "unknown",
        }
    }

    /// One sentence for a person: what the file is and what to run instead. `path`,
    /// when known, is used to spell out the exact command.
    pub fn advice(&self, path: Option<&Path>) -> String {
        let shown = path.map_or_else(
            || "the file".to_string(),
            |p| printable(&p.display().to_string()).into_owned(),
        );
        match self {
            FileKind::Export { version } => format!(
                "{shown} is a .dmexp export (format version {version}); read it with `dormouse export info {shown}`"
            ),
            FileKind::TrainingCheckpoint => format!(
                "{shown} is a dormouse TRAINING CHECKPOINT (model + optimizer + EMA teacher), not an \
                 export; convert it with: {}",
                export_command(path)
            ),
            FileKind::EngramSidecar => format!(
                "{shown} is the host-RAM Engram memory of an --engram-ram training run (a .ngram \
                 sidecar), not an export; it only serves to resume that run with `dormouse train --resume`, \
                 and no export carries it"
            ),
            FileKind::OriginalCheckpoint => format!(
                "{shown} is a training checkpoint of the original burn-based dormouse (magic DMCK v2); \
                 this repository cannot read it: train a new run with `dormouse train`, then \
                 `dormouse export run`"
            ),
            FileKind::TileContainer => format!(
                "{shown} is a minirun tile container (MNRNTIL1), not a dormouse export; inspect it with \
                 `minirun info`"
            ),
            FileKind::Safetensors => format!(
                "{shown} is a safetensors file, not a dormouse export; if it belongs to an upstream \
                 checkpoint directory, `minirun pack --source <that directory> --out <artifact dir>` \
                 repacks it for minirun"
            ),
            FileKind::Gguf => format!(
                "{shown} is a GGUF (llama.cpp) file; neither dormouse nor minirun reads GGUF"
            ),
            FileKind::Zip => format!(
                "{shown} is a zip archive (a PyTorch .pt/.pth checkpoint is one), not a dormouse export"
            ),
            FileKind::TooShort { len } => format!(
                "{shown} is {len} bytes long, too short to be any known model file (an export has a \
                 24-byte prefix)"
            ),
            FileKind::Unknown { first_bytes } => format!(
                "{shown} is not a dormouse export: it starts with {} where an export starts with \
                 \"DMEXPRT\\x01\"",
                ShownBytes(first_bytes)
            ),
        }
    }
}

/// `dormouse export run --ckpt-dir DIR --ckpt-name NAME --dtype bf16` for a checkpoint at
/// `path`.
pub fn export_command(path: Option<&Path>) -> String {
    let (dir, name) = match path {
        Some(p) => {
            let dir = p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map_or_else(|| ".".to_string(), |d| d.display().to_string());
            let name = p.file_stem().map_or_else(
                || "<name>".to_string(),
                |s| s.to_string_lossy().into_owned(),
            );
            (dir, name)
        }
        None => ("<ckpt-dir>".to_string(), "<ckpt-name>".to_string()),
    };
    format!("dormouse export run --ckpt-dir {dir} --ckpt-name {name} --dtype bf16")
}

/// `text` with every control character (C0, DEL, C1: the escape sequences a terminal obeys,
/// carriage returns, newlines) written as its Rust escape (`\u{1b}`, `\n`), for printing a
/// name or a path that came from a file or a server: it cannot move the cursor, recolour the
/// terminal or forge a line.
pub fn printable(text: &str) -> Cow<'_, str> {
    escape_controls(text, false)
}

/// [`printable`] for text of several lines: newlines are kept, every other control character
/// is escaped.
pub fn printable_lines(text: &str) -> Cow<'_, str> {
    escape_controls(text, true)
}

fn escape_controls(text: &str, keep_newlines: bool) -> Cow<'_, str> {
    let escaped = |c: char| c.is_control() && !(keep_newlines && c == '\n');
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match escaped(c) {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Bytes shown as a quoted string with non-printable bytes escaped.
struct ShownBytes<'a>(&'a [u8]);

impl fmt::Display for ShownBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        for &b in self.0 {
            if b.is_ascii_graphic() || b == b' ' {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        f.write_str("\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_known_magic_is_recognised() {
        let mut safetensors = 64u64.to_le_bytes().to_vec();
        safetensors.extend_from_slice(b"{\"a\":1}");
        let cases: Vec<(Vec<u8>, FileKind)> = vec![
            (b"DMEXPRT\x07rest".to_vec(), FileKind::Export { version: 7 }),
            (b"DMTRAIN\0\x01".to_vec(), FileKind::TrainingCheckpoint),
            (b"DMCK\0\x02\0\0....".to_vec(), FileKind::OriginalCheckpoint),
            (b"DMNGRAM\0\x01\0".to_vec(), FileKind::EngramSidecar),
            (b"MNRNTIL1\x01\0".to_vec(), FileKind::TileContainer),
            (b"GGUF\x03\0\0\0".to_vec(), FileKind::Gguf),
            (b"PK\x03\x04\x14\0".to_vec(), FileKind::Zip),
            (safetensors, FileKind::Safetensors),
            (b"abc".to_vec(), FileKind::TooShort { len: 3 }),
        ];
        for (bytes, kind) in cases {
            assert_eq!(identify(&bytes), kind, "{bytes:?}");
        }
    }

    #[test]
    fn checkpoint_advice_spells_out_the_export_command_for_its_path() {
        let advice =
            FileKind::TrainingCheckpoint.advice(Some(Path::new("runs/checkpoints/latest.bin")));
        assert!(advice.contains("TRAINING CHECKPOINT"), "{advice}");
        assert!(
            advice.contains(
                "dormouse export run --ckpt-dir runs/checkpoints --ckpt-name latest --dtype bf16"
            ),
            "{advice}"
        );
        assert_eq!(
            export_command(Some(Path::new("best.bin"))),
            "dormouse export run --ckpt-dir . --ckpt-name best --dtype bf16"
        );
    }

    /// A safetensors header length is taken up to the 100 MB safetensors itself accepts, and
    /// only with the JSON header's `{` after it.
    #[test]
    fn a_safetensors_header_is_a_bounded_length_then_a_brace() {
        let with = |len: u64, next: u8| {
            let mut bytes = len.to_le_bytes().to_vec();
            bytes.push(next);
            identify(&bytes)
        };
        assert_eq!(with(100_000_000, b'{'), FileKind::Safetensors);
        assert_eq!(with(2, b'{'), FileKind::Safetensors);
        for (len, next) in [(100_000_001, b'{'), (1, b'{'), (64, b'[')] {
            assert!(
                matches!(with(len, next), FileKind::Unknown { .. }),
                "{len} then {next}"
            );
        }
    }

    #[test]
    fn eight_unknown_bytes_are_unknown_and_seven_too_short() {
        assert_eq!(
            identify(b"12345678"),
            FileKind::Unknown {
                first_bytes: b"12345678".to_vec()
            }
        );
        assert_eq!(identify(b"1234567"), FileKind::TooShort { len: 7 });
    }

    /// The labels are what `--json` prints for scripts: each kind has its own, fixed.
    #[test]
    fn every_kind_has_its_own_label() {
        let kinds = [
            (FileKind::Export { version: 1 }, "dmexp-export"),
            (FileKind::TrainingCheckpoint, "dormouse-training-checkpoint"),
            (FileKind::EngramSidecar, "dormouse-engram-sidecar"),
            (FileKind::OriginalCheckpoint, "original-dormouse-checkpoint"),
            (FileKind::TileContainer, "tile-container"),
            (FileKind::Safetensors, "safetensors"),
            (FileKind::Gguf, "gguf"),
            (FileKind::Zip, "zip"),
            (FileKind::TooShort { len: 0 }, "too-short"),
            (
                FileKind::Unknown {
                    first_bytes: vec![],
                },
                "unknown",
            ),
        ];
        for (kind, label) in kinds {
            assert_eq!(kind.label(), label);
        }
    }

    #[test]
    fn unknown_bytes_are_shown_escaped() {
        let kind = identify(b"\x00\x01hello!!");
        let advice = kind.advice(None);
        assert!(advice.contains(r#""\x00\x01hello!""#), "{advice}");
    }

    #[test]
    fn control_characters_in_names_are_escaped_for_the_terminal() {
        assert_eq!(printable("blk.0.weight"), "blk.0.weight");
        assert_eq!(
            printable("a\u{1b}[2Jb\nc\rd\u{9b}e"),
            "a\\u{1b}[2Jb\\nc\\rd\\u{9b}e"
        );
        assert_eq!(printable_lines("one\ntwo\u{7}"), "one\ntwo\\u{7}");
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
    }
}
