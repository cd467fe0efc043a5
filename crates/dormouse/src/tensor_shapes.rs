//! The names and shapes of the tensors a config's model has, and the first difference from
//! the ones a file holds.
//!
//! Export and loading both compare a file's tensors with the model built from its config
//! before a value is used, so a config and weights that disagree are refused by name instead
//! of being loaded into the wrong places. Building the model for this costs allocations of
//! zeros, never a random draw and never the file's values.

use std::collections::BTreeMap;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;

use crate::config::DormouseConfig;
use crate::model::Dormouse;

/// Records the name and shape of every tensor a model asks for, handing out zeros (a model
/// built on it costs allocations, not random draws).
#[derive(Default)]
struct ShapeRecorder {
    seen: std::sync::Mutex<BTreeMap<String, Vec<u64>>>,
}

impl candle_nn::var_builder::SimpleBackend for ShapeRecorder {
    fn get(
        &self,
        shape: candle_core::Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        let dims = shape.dims().iter().map(|&d| d as u64).collect();
        self.seen
            .lock()
            .map_err(|_| candle_core::Error::Msg("the shape record is poisoned".into()))?
            .insert(name.to_string(), dims);
        // One zero broadcast to the shape: a header that asks for enormous tensors costs
        // nothing before it is compared with the payload.
        candle_core::Tensor::zeros((), dtype, device)?.broadcast_as(shape)
    }

    fn get_unchecked(
        &self,
        name: &str,
        _: DType,
        _: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        candle_core::bail!("{name}: the model asked for a tensor without a shape")
    }

    fn contains_tensor(&self, _: &str) -> bool {
        false
    }
}

/// Name and dims of every tensor the model built from `cfg` has, sorted by name.
pub fn expected_tensors(cfg: &DormouseConfig) -> candle_core::Result<BTreeMap<String, Vec<u64>>> {
    let recorder = std::sync::Arc::new(ShapeRecorder::default());
    let backend: Box<dyn candle_nn::var_builder::SimpleBackend> =
        Box::new(SharedRecorder(recorder.clone()));
    Dormouse::new(
        cfg,
        VarBuilder::from_backend(backend, DType::F32, Device::Cpu),
    )?;
    let seen = recorder
        .seen
        .lock()
        .map_err(|_| candle_core::Error::Msg("the shape record is poisoned".into()))?;
    Ok(seen.clone())
}

/// A recorder the caller keeps a handle on after handing it to a `VarBuilder`.
struct SharedRecorder(std::sync::Arc<ShapeRecorder>);

impl candle_nn::var_builder::SimpleBackend for SharedRecorder {
    fn get(
        &self,
        shape: candle_core::Shape,
        name: &str,
        init: candle_nn::Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        self.0.get(shape, name, init, dtype, device)
    }

    fn get_unchecked(
        &self,
        name: &str,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        self.0.get_unchecked(name, dtype, device)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.contains_tensor(name)
    }
}

/// The first difference between the tensors a config needs and the ones a file has.
pub fn tensor_mismatch(
    expected: &BTreeMap<String, Vec<u64>>,
    found: &BTreeMap<String, Vec<u64>>,
) -> Option<String> {
    for (name, dims) in expected {
        match found.get(name) {
            None => return Some(format!("{name} is missing")),
            Some(d) if d != dims => {
                return Some(format!("{name} has dims {d:?}, the config needs {dims:?}"));
            }
            Some(_) => {}
        }
    }
    found
        .keys()
        .find(|name| !expected.contains_key(*name))
        .map(|name| format!("{name} is not a tensor of this model"))
}
