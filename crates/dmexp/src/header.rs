//! The TOML header: what it holds on disk ([`RawHeader`]) and what a validated header
//! promises ([`Header`]): every tensor's place in the payload, computed with checked
//! arithmetic and matched against the payload length.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;
use crate::error::Error;
use crate::layout::FORMAT_VERSION;

/// The header exactly as serialized. Field order is the on-disk key order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeader {
    format: i64,
    dtype: String,
    source: String,
    step: u64,
    num_params: u64,
    num_tensors: u64,
    flushed: u64,
    max_abs: f64,
    min_nonzero_abs: f64,
    config: toml::Table,
    tensors: Vec<RawTensor>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    overflowed: u64,
}

/// A validated header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Storage type of every value.
    pub dtype: Dtype,
    /// The checkpoint this export was made from, with its step.
    pub source: String,
    /// The training step of that checkpoint.
    pub step: u64,
    /// Total number of values over all tensors.
    pub num_params: u64,
    /// Non-zero weights that narrowing turned into ±0.
    pub flushed: u64,
    /// Largest |value| as stored.
    pub max_abs: f32,
    /// Smallest non-zero |value| as stored (0 when every value is 0).
    pub min_nonzero_abs: f32,
    /// The model config, opaque to this crate.
    pub config: toml::Table,
    /// The tensors in payload order.
    pub tensors: Vec<TensorEntry>,
}

/// One tensor of the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Module path, e.g. `blocks.0.attn.q_proj.weight`.
    pub name: String,
    /// Row-major dims.
    pub dims: Vec<u64>,
    /// Byte offset of the tensor within the payload.
    pub offset: u64,
    /// Number of values (product of dims).
    pub num_values: u64,
    /// Number of payload bytes (values x dtype size).
    pub byte_len: u64,
}

impl Header {
    /// Number of tensors.
    pub fn num_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// Payload bytes the tensors occupy.
    pub fn payload_len(&self) -> u64 {
        self.tensors.iter().map(|t| t.byte_len).sum()
    }

    /// The entry named `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The entry named `name`, or [`Error::NoSuchTensor`].
    pub fn require(&self, name: &str) -> Result<&TensorEntry, Error> {
        self.tensor(name).ok_or_else(|| Error::NoSuchTensor {
            name: name.to_string(),
        })
    }

    /// Serializes the header to its TOML text.
    pub fn to_toml(&self) -> Result<String, Error> {
        let raw = RawHeader {
            format: i64::from(FORMAT_VERSION),
            dtype: self.dtype.name().to_string(),
            source: self.source.clone(),
            step: self.step,
            num_params: self.num_params,
            num_tensors: self.tensors.len() as u64,
            flushed: self.flushed,
            max_abs: f64::from(self.max_abs),
            min_nonzero_abs: f64::from(self.min_nonzero_abs),
            config: self.config.clone(),
            tensors: self
                .tensors
                .iter()
                .map(|t| RawTensor {
                    name: t.name.clone(),
                    dims: t.dims.clone(),
                    overflowed: 0,
                })
                .collect(),
        };
        toml::to_string(&raw).map_err(|e| Error::HeaderToml {
            message: e.to_string(),
        })
    }

    /// Parses and validates header bytes against the prefix's version byte and payload
    /// length, in the documented order.
    pub fn parse(bytes: &[u8], version_byte: u8, payload_len: u64) -> Result<Header, Error> {
        let text = std::str::from_utf8(bytes).map_err(|e| Error::HeaderNotUtf8 {
            valid_up_to: e.valid_up_to(),
        })?;
        let raw: RawHeader = toml::from_str(text).map_err(|e| Error::HeaderToml {
            message: e.to_string(),
        })?;
        validate(raw, version_byte, payload_len)
    }
}

fn validate(raw: RawHeader, version_byte: u8, payload_len: u64) -> Result<Header, Error> {
    if raw.format != i64::from(version_byte) {
        return Err(Error::FormatMismatch {
            header: raw.format,
            version_byte,
        });
    }
    let dtype = header_dtype(&raw.dtype)?;
    let listed = raw.tensors.len() as u64;
    if raw.num_tensors != listed {
        return Err(Error::TensorCountMismatch {
            declared: raw.num_tensors,
            listed,
        });
    }
    let tensors = lay_out_tensors(raw.tensors, dtype)?;
    let counted = tensors.iter().map(|t| t.num_values).sum::<u64>();
    if raw.num_params != counted {
        return Err(Error::ParamCountMismatch {
            declared: raw.num_params,
            counted,
        });
    }
    let needed = tensors.last().map_or(0, |t| t.offset + t.byte_len);
    if needed != payload_len {
        return Err(Error::PayloadSizeMismatch {
            needed,
            payload_len,
        });
    }
    let (max_abs, min_nonzero_abs) = check_statistics(
        raw.max_abs,
        raw.min_nonzero_abs,
        raw.flushed,
        raw.num_params,
    )?;
    if dtype == Dtype::F32 && raw.flushed != 0 {
        return Err(Error::ImpossibleStatistics {
            reason: format!(
                "an f32 export stores every value verbatim, yet flushed = {}",
                raw.flushed
            ),
        });
    }
    Ok(Header {
        dtype,
        source: raw.source,
        step: raw.step,
        num_params: raw.num_params,
        flushed: raw.flushed,
        max_abs,
        min_nonzero_abs,
        config: raw.config,
        tensors,
    })
}

/// The header accepts only the canonical names; aliases are for people typing flags.
fn header_dtype(name: &str) -> Result<Dtype, Error> {
    Dtype::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| Error::UnknownDtype {
            found: name.to_string(),
        })
}

/// Checks every entry and assigns payload offsets. Every product and sum is checked,
/// so the total (and therefore every offset) fits in a u64.
fn lay_out_tensors(raw: Vec<RawTensor>, dtype: Dtype) -> Result<Vec<TensorEntry>, Error> {
    if raw.is_empty() {
        return Err(Error::NoTensors);
    }
    let mut seen = HashSet::with_capacity(raw.len());
    let mut offset = 0u64;
    let mut num_params = 0u64;
    let mut out = Vec::with_capacity(raw.len());
    for (index, t) in raw.into_iter().enumerate() {
        let (num_values, byte_len) = check_entry(&t, index, dtype, &mut seen)?;
        let overflow = || Error::DimsOverflow {
            name: t.name.clone(),
            dims: t.dims.clone(),
        };
        num_params = num_params.checked_add(num_values).ok_or_else(overflow)?;
        let next = offset.checked_add(byte_len).ok_or_else(overflow)?;
        out.push(TensorEntry {
            name: t.name,
            dims: t.dims,
            offset,
            num_values,
            byte_len,
        });
        offset = next;
    }
    Ok(out)
}

/// Checks one entry on its own; returns (values, bytes).
fn check_entry(
    t: &RawTensor,
    index: usize,
    dtype: Dtype,
    seen: &mut HashSet<String>,
) -> Result<(u64, u64), Error> {
    if t.name.is_empty() {
        return Err(Error::EmptyTensorName { index });
    }
    if !seen.insert(t.name.clone()) {
        return Err(Error::DuplicateTensor {
            name: t.name.clone(),
        });
    }
    let (num_values, byte_len) = tensor_size(&t.name, &t.dims, dtype)?;
    if t.overflowed != 0 {
        return Err(Error::OverflowedTensor {
            name: t.name.clone(),
            count: t.overflowed,
        });
    }
    Ok((num_values, byte_len))
}

/// Number of values and bytes of a tensor with `dims`, refusing empty or zero dims and
/// any product that overflows.
pub(crate) fn tensor_size(name: &str, dims: &[u64], dtype: Dtype) -> Result<(u64, u64), Error> {
    if dims.is_empty() || dims.contains(&0) {
        return Err(Error::InvalidDims {
            name: name.to_string(),
            dims: dims.to_vec(),
        });
    }
    let overflow = || Error::DimsOverflow {
        name: name.to_string(),
        dims: dims.to_vec(),
    };
    let values = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    let bytes = values.checked_mul(dtype.size()).ok_or_else(overflow)?;
    Ok((values, bytes))
}

/// The statistics must be finite f32 values with 0 <= min <= max, both zero or both not.
fn check_statistics(
    max_abs: f64,
    min_nonzero_abs: f64,
    flushed: u64,
    num_params: u64,
) -> Result<(f32, f32), Error> {
    let as_f32 = |field: &str, v: f64| -> Result<f32, Error> {
        let narrowed = v as f32;
        if !v.is_finite() || v.is_sign_negative() || f64::from(narrowed) != v {
            return Err(Error::ImpossibleStatistics {
                reason: format!("{field} = {v} is not a non-negative finite f32"),
            });
        }
        Ok(narrowed)
    };
    let max = as_f32("max_abs", max_abs)?;
    let min = as_f32("min_nonzero_abs", min_nonzero_abs)?;
    if min > max || (min == 0.0) != (max == 0.0) {
        return Err(Error::ImpossibleStatistics {
            reason: format!("min_nonzero_abs = {min:e} does not fit max_abs = {max:e}"),
        });
    }
    if flushed > num_params {
        return Err(Error::ImpossibleStatistics {
            reason: format!("flushed = {flushed} exceeds num_params = {num_params}"),
        });
    }
    Ok((max, min))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(max_abs: f64, min_nonzero_abs: f64, flushed: u64, num_params: u64) -> bool {
        matches!(
            check_statistics(max_abs, min_nonzero_abs, flushed, num_params),
            Err(Error::ImpossibleStatistics { .. })
        )
    }

    #[test]
    fn statistics_are_non_negative_finite_f32_values() {
        assert_eq!(check_statistics(2.5, 0.5, 0, 1).unwrap(), (2.5, 0.5));
        assert!(refused(-2.5, 0.5, 0, 1), "a negative max");
        assert!(refused(2.5, -0.5, 0, 1), "a negative min");
        assert!(refused(f64::INFINITY, 0.5, 0, 1), "an infinite max");
        assert!(refused(f64::NAN, 0.5, 0, 1), "a NaN max");
        assert!(refused(0.1, 0.5, 0, 1), "0.1 is no f32");
    }

    #[test]
    fn the_smallest_must_fit_the_largest() {
        assert!(refused(1.0, 2.0, 0, 1), "min above max");
        assert!(refused(1.0, 0.0, 0, 1), "a zero min beside a non-zero max");
        assert!(refused(0.0, 1.0, 0, 1), "a non-zero min beside a zero max");
        assert_eq!(check_statistics(0.0, 0.0, 0, 1).unwrap(), (0.0, 0.0));
        assert_eq!(check_statistics(1.0, 1.0, 0, 1).unwrap(), (1.0, 1.0));
    }

    #[test]
    fn every_value_may_be_flushed_but_no_more() {
        assert!(check_statistics(1.0, 0.5, 7, 7).is_ok());
        assert!(refused(1.0, 0.5, 8, 7));
    }
}
