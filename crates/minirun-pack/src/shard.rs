//! Safetensors shards read without loading them: the header is parsed by the
//! `safetensors` crate's own `Metadata` and validated like its full reader does (offsets
//! contiguous from 0, sizes = shape x dtype, data ending exactly at the end of the file);
//! tensor bytes are then read by range.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata};

use crate::PackError;

/// Safetensors refuses headers above 100 MB; so do we, before allocating.
const MAX_HEADER: u64 = 100_000_000;
/// The most tensors one shard may hold. Parsing a header and keeping its tensors costs about
/// 1.5 KB per tensor (a 27 MB header of 400,000 tiny tensors took 636 MB in `pack`), so the
/// count is what bounds it. Counted by a pass that keeps only the names, before the full parse.
pub const MAX_TENSORS_PER_SHARD: usize = 1 << 16;
/// The most dimensions a tensor may have. Checkpoint tensors have at most five; a parsed
/// dimension costs four times its two JSON bytes (`1,`), so without this one 100 MB header of
/// a single tensor's shape took 3.2 GB in `pack`. Counted in the same names-only pass.
pub const MAX_RANK: usize = 8;

/// One tensor's place in its shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSource {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// The shard's file name, relative to the checkpoint directory.
    pub shard: String,
    /// Absolute byte offset of the tensor's data in the shard.
    pub start: u64,
    pub len: u64,
}

/// A shard whose header has been validated.
#[derive(Debug)]
pub struct Shard {
    pub path: PathBuf,
    pub file_name: String,
    /// The header's length in bytes.
    pub header_bytes: u64,
    pub tensors: Vec<TensorSource>,
}

impl Shard {
    pub fn open(path: &Path) -> Result<Shard, PackError> {
        let bad = |reason: String| PackError::BadShard {
            path: path.to_path_buf(),
            reason,
        };
        let mut file = regular_file::open(path).map_err(|e| PackError::io(path, e))?;
        let file_len = file.metadata().map_err(|e| PackError::io(path, e))?.len();
        let mut len_bytes = [0u8; 8];
        file.read_exact(&mut len_bytes).map_err(|_| {
            bad(format!(
                "{file_len} bytes is too short for a safetensors header"
            ))
        })?;
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > MAX_HEADER || header_len.saturating_add(8) > file_len {
            return Err(bad(format!(
                "the header length field says {header_len} bytes but the file has {file_len}"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header)
            .map_err(|e| PackError::io(path, e))?;
        let text =
            std::str::from_utf8(&header).map_err(|e| bad(format!("header is not UTF-8: {e}")))?;
        match scan_keys(text) {
            KeyScan::Repeated(name) => {
                return Err(bad(format!(
                    "the header names tensor {name:?} twice; a reader keeps one of the two at random, so the file has no single meaning"
                )));
            }
            KeyScan::TooMany => {
                return Err(bad(format!(
                    "the header names more than {MAX_TENSORS_PER_SHARD} tensors, far more than any real shard; this build refuses it rather than spend gigabytes parsing it"
                )));
            }
            KeyScan::TooManyDimensions(name) => {
                return Err(bad(format!(
                    "tensor {name:?} has more than {MAX_RANK} dimensions, more than any checkpoint tensor; this build refuses it rather than spend gigabytes parsing its shape"
                )));
            }
            KeyScan::Unique => {}
        }
        let metadata: Metadata = serde_json::from_str(text)
            .map_err(|e| bad(format!("header is not a safetensors header: {e}")))?;
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let data_start = 8 + header_len;
        let tensors = validate(&metadata, data_start, file_len, &file_name).map_err(bad)?;
        Ok(Shard {
            path: path.to_path_buf(),
            file_name,
            header_bytes: header_len,
            tensors,
        })
    }
}

/// What a pass over a header's top-level keys found.
enum KeyScan {
    /// The first key the object repeats: a JSON map keeps the last of two equal keys, which
    /// would silently drop a tensor's first entry.
    Repeated(String),
    /// More than [`MAX_TENSORS_PER_SHARD`] keys (the pass stops there).
    TooMany,
    /// The first tensor whose shape has more than [`MAX_RANK`] dimensions.
    TooManyDimensions(String),
    /// Neither (or not a JSON object at all, which the full parse then reports).
    Unique,
}

/// Walks the header's top-level keys keeping only their names, values skipped unparsed.
fn scan_keys(header: &str) -> KeyScan {
    struct Keys(KeyScan);
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Keys, A::Error> {
                    // The map is read to its end even after a finding: the parser refuses a
                    // map left half-read, which would hide the finding.
                    let mut seen = std::collections::HashSet::new();
                    let mut found = KeyScan::Unique;
                    while let Some(key) = map.next_key::<String>()? {
                        let rank = match key.as_str() {
                            "__metadata__" => map.next_value::<serde::de::IgnoredAny>().map(|_| 0),
                            _ => map.next_value::<ShapeRank>().map(|r| r.0),
                        }?;
                        if !matches!(found, KeyScan::Unique) {
                            continue;
                        }
                        if rank > MAX_RANK {
                            found = KeyScan::TooManyDimensions(key);
                        } else if !seen.insert(key.clone()) {
                            found = KeyScan::Repeated(key);
                        } else if seen.len()
                            > MAX_TENSORS_PER_SHARD + usize::from(seen.contains("__metadata__"))
                        {
                            seen.clear();
                            found = KeyScan::TooMany;
                        }
                    }
                    Ok(Keys(found))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    serde_json::from_str::<Keys>(header).map_or(KeyScan::Unique, |k| k.0)
}

/// How many dimensions a tensor entry's `shape` lists, counted without keeping them; 0 for an
/// entry without one (the full parse refuses it).
struct ShapeRank(usize);

impl<'de> serde::Deserialize<'de> for ShapeRank {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = ShapeRank;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a tensor entry")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ShapeRank, A::Error> {
                let mut rank = 0;
                while let Some(field) = map.next_key::<String>()? {
                    match field.as_str() {
                        "shape" => rank = map.next_value::<Count>()?.0,
                        _ => drop(map.next_value::<serde::de::IgnoredAny>()?),
                    }
                }
                Ok(ShapeRank(rank))
            }
        }
        d.deserialize_map(Entry)
    }
}

/// The length of a JSON array, its elements skipped.
struct Count(usize);

impl<'de> serde::Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Elements;
        impl<'de> serde::de::Visitor<'de> for Elements {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Count, A::Error> {
                let mut n = 0;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
        }
        d.deserialize_seq(Elements)
    }
}

/// The checks `SafeTensors::deserialize` makes, applied to a header read on its own.
fn validate(
    metadata: &Metadata,
    data_start: u64,
    file_len: u64,
    shard: &str,
) -> Result<Vec<TensorSource>, String> {
    let mut tensors = Vec::new();
    let mut expected_start = 0usize;
    for name in metadata.offset_keys() {
        let Some(info) = metadata.info(&name) else {
            continue;
        };
        let (s, e) = info.data_offsets;
        if s != expected_start || e < s {
            return Err(format!(
                "tensor {name:?} does not start where the previous one ended"
            ));
        }
        let bits = info
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .and_then(|n| n.checked_mul(info.dtype.bitsize()))
            .ok_or_else(|| format!("tensor {name:?}: shape {:?} overflows", info.shape))?;
        if bits % 8 != 0 || e - s != bits / 8 {
            return Err(format!(
                "tensor {name:?}: {} bytes for shape {:?} of {:?}",
                e - s,
                info.shape,
                info.dtype
            ));
        }
        tensors.push(TensorSource {
            name: name.clone(),
            dtype: info.dtype,
            shape: info.shape.clone(),
            shard: shard.to_string(),
            start: data_start + s as u64,
            len: (e - s) as u64,
        });
        expected_start = e;
    }
    if data_start + expected_start as u64 != file_len {
        return Err(format!(
            "the tensors end at byte {} but the file has {file_len} bytes",
            data_start + expected_start as u64
        ));
    }
    Ok(tensors)
}

/// Reads `len` bytes at `offset` of `source`'s tensor into `buf` (resized to `len`): a
/// bounded read of one tensor slice, reusing the caller's buffer.
pub fn read_slice_into(
    dir: &Path,
    source: &TensorSource,
    offset: u64,
    len: u64,
    buf: &mut Vec<u8>,
) -> Result<(), PackError> {
    let path = dir.join(&source.shard);
    if offset.checked_add(len).is_none_or(|end| end > source.len) {
        return Err(PackError::BadShard {
            path,
            reason: format!("read past the end of tensor {:?}", source.name),
        });
    }
    let file = regular_file::open(&path).map_err(|e| PackError::io(&path, e))?;
    buf.resize(len as usize, 0);
    file.read_exact_at(buf, source.start + offset)
        .map_err(|e| PackError::io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard_with_header(dir: &Path, header: &str, data: usize) -> PathBuf {
        let path = dir.join("model.safetensors");
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + data, 0);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_tensor_named_twice_in_the_header_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let one = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        assert!(Shard::open(&shard_with_header(dir.path(), one, 4)).is_ok());
        let twice = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let err = Shard::open(&shard_with_header(dir.path(), twice, 8))
            .unwrap_err()
            .to_string();
        assert!(err.contains("names tensor \"a\" twice"), "{err}");

        // A repeat followed by more tensors (which the last-wins parse would keep).
        let then_more = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        let err = Shard::open(&shard_with_header(dir.path(), then_more, 8))
            .unwrap_err()
            .to_string();
        assert!(err.contains("names tensor \"a\" twice"), "{err}");
    }

    #[test]
    fn a_header_of_more_tensors_than_any_shard_holds_is_refused_before_it_is_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let header = |count: usize| {
            let entries: Vec<String> = (0..count)
                .map(|i| {
                    format!(
                        r#""t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#,
                        i + 1
                    )
                })
                .collect();
            format!("{{{}}}", entries.join(","))
        };
        let most = MAX_TENSORS_PER_SHARD;
        let fits = shard_with_header(dir.path(), &header(most), most);
        assert_eq!(Shard::open(&fits).unwrap().tensors.len(), most);
        let over = shard_with_header(dir.path(), &header(most + 1), most + 1);
        let Err(err) = Shard::open(&over) else {
            panic!("a shard of {} tensors was parsed", most + 1);
        };
        assert!(err.to_string().contains("more than 65536 tensors"), "{err}");
    }
}
