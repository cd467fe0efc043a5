//! A model with every parameter drawn from a seed.
//!
//! candle's CPU generator cannot be seeded, so a run's initialisation is drawn here instead:
//! the same seed gives the same model on every machine, which is what makes a run
//! reproducible and a resumed run comparable with the uninterrupted one.

use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

use crate::config::DormouseConfig;
use crate::model::Dormouse;
use crate::rng::{purpose, stream};

/// Every variable, sorted by name: the one order initialisation, optimizer state and the EMA
/// teacher follow (a `VarMap` iterates in hash order, which differs between processes).
pub fn sorted_vars(varmap: &VarMap) -> Result<Vec<(String, Var)>> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| candle_core::Error::Msg("the variable map is poisoned".into()))?;
    let mut vars: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(vars)
}

/// Builds the model with every parameter drawn from `seed`: tables and the embedding
/// N(0, 0.02), norms 1, biases 0, other matrices uniform in +-1/sqrt(fan_in).
pub fn seeded_model(
    cfg: &DormouseConfig,
    seed: u64,
    device: &Device,
) -> Result<(VarMap, Dormouse)> {
    let varmap = VarMap::new();
    let model = Dormouse::new(cfg, VarBuilder::from_varmap(&varmap, DType::F32, device))?;
    for (i, (name, var)) in sorted_vars(&varmap)?.into_iter().enumerate() {
        let mut rng = stream(seed, purpose::MODEL_INIT, i as u64);
        let dims = var.dims().to_vec();
        let n = var.elem_count();
        let fan_in = *dims.last().unwrap_or(&1) as f64;
        let values: Vec<f32> = if name.ends_with("norm.weight") {
            vec![1.0; n]
        } else if name.ends_with(".bias") {
            vec![0.0; n]
        } else if name.ends_with(".table") || name == "embed.weight" {
            (0..n).map(|_| (0.02 * rng.next_normal()) as f32).collect()
        } else {
            let bound = 1.0 / fan_in.sqrt();
            (0..n)
                .map(|_| ((2.0 * rng.next_f64() - 1.0) * bound) as f32)
                .collect()
        };
        var.set(&Tensor::from_vec(values, dims, device)?)?;
    }
    Ok((varmap, model))
}
