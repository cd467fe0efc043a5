//! The `.dmexp` inference export: one self-describing, checksummed file of model weights.
//!
//! ```text
//! [0..8)    "DMEXPRT" + version byte 0x01
//! [8..12)   header length H, u32 LE
//! [12..20)  payload length P, u64 LE
//! [20..24)  CRC-32 (IEEE) of the payload, u32 LE
//! [24..24+H)  header: UTF-8 TOML (dtype, source, step, counts, statistics, config, tensors)
//! [24+H..)    payload: the tensors in header order, contiguous, no padding
//! ```
//!
//! The full specification, with every header key and the order of the decoder's checks,
//! is `docs/formats/dmexp.md`. This crate knows nothing about models: the `config` table
//! is carried verbatim, and loading always yields f32 values.
//!
//! ```
//! use dmexp::{Dtype, ExportMeta, TensorRef};
//! let meta = ExportMeta { source: "checkpoints/latest.bin@step20".into(), step: 20, config: toml::Table::new() };
//! let weights = [0.5f32, -1.25, 3.0e-9, 0.0];
//! let tensors = [TensorRef { name: "embed.weight", dims: &[2, 2], values: &weights }];
//! let encoded = dmexp::encode(&meta, &tensors, Dtype::F32)?;
//! assert_eq!(encoded.file_len(), 24 + encoded.prefix().header_len as u64 + 4 * 4);
//! let export = dmexp::decode(&encoded.to_bytes())?;
//! assert_eq!(export.tensor("embed.weight").unwrap().1, &weights);
//! # Ok::<(), dmexp::Error>(())
//! ```

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod decode;
mod dtype;
mod encode;
mod error;
mod file;
mod header;
pub mod identify;
mod info;
pub mod layout;
pub mod narrow;

pub use decode::{Export, ExportView, decode, view};
pub use dtype::{Dtype, UnknownDtype};
pub use encode::{Encoded, ExportMeta, TensorRef, encode};
pub use error::Error;
pub use file::{DmexpFile, Written, encode_to_path, read, write_atomic};
pub use header::{Header, TensorEntry};
pub use identify::{FileKind, identify};
pub use info::{Info, InfoTensor, info};
pub use layout::Prefix;
pub use narrow::NarrowStats;
