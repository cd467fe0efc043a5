//! Named tensors to and from safetensors bytes (the checkpoint's `model`, `ema` and `optim`
//! sections), checked name by name and shape by shape against the model being loaded.

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};
use candle_nn::VarMap;

/// Why tensors could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("the weights lack tensor {name:?}, which the model built from the config needs")]
    Missing { name: String },
    #[error(
        "tensor {name:?} is {found:?} in the weights but {expected:?} in the model built from the config"
    )]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error(
        "the weights hold tensor {name:?}, which the model built from the config does not have"
    )]
    Unexpected { name: String },
    #[error("not readable as safetensors: {0}")]
    Format(String),
}

/// The variables of `varmap` as a safetensors file, in name order.
pub fn save_varmap(varmap: &VarMap) -> Result<Vec<u8>, WeightsError> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| WeightsError::Format("the variable map is poisoned".into()))?;
    let sorted: BTreeMap<String, Tensor> = data
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    safetensors::serialize(sorted.iter(), None).map_err(|e| WeightsError::Format(e.to_string()))
}

/// Loads `bytes` into `varmap`: every variable must be present with exactly its shape, and
/// nothing else may be present. Nothing is changed unless everything matches.
pub fn load_into_varmap(
    varmap: &VarMap,
    bytes: &[u8],
    device: &Device,
) -> Result<(), WeightsError> {
    let loaded = candle_core::safetensors::load_buffer(bytes, device)
        .map_err(|e| WeightsError::Format(e.to_string()))?;
    let data = varmap
        .data()
        .lock()
        .map_err(|_| WeightsError::Format("the variable map is poisoned".into()))?;
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for name in &names {
        let tensor = loaded.get(*name).ok_or_else(|| WeightsError::Missing {
            name: (*name).clone(),
        })?;
        let expected = data[*name].dims().to_vec();
        if tensor.dims() != expected.as_slice() {
            return Err(WeightsError::Shape {
                name: (*name).clone(),
                expected,
                found: tensor.dims().to_vec(),
            });
        }
    }
    if let Some(extra) = loaded.keys().filter(|k| !data.contains_key(*k)).min() {
        return Err(WeightsError::Unexpected {
            name: extra.clone(),
        });
    }
    for name in names {
        data[name]
            .set(&loaded[name])
            .map_err(|e| WeightsError::Format(e.to_string()))?;
    }
    Ok(())
}
