//! The fused training kernels against the same functions built from candle's differentiable
//! primitives (the form the model had before them): forward values and every input's gradient,
//! through a random linear read-out so no gradient is trivially uniform. Also: the kernels' bits
//! do not depend on the number of threads, and the in-place AdamW update gives the bits of the
//! update composed from tensor operations.

use candle_core::backprop::GradStore;
use candle_core::{D, Device, Result, Tensor, Var};
use dormouse::fused::attention::causal_attention;
use dormouse::fused::cross_entropy::cross_entropy;
use dormouse::fused::linear::linear;
use dormouse::fused::rms_norm::rms_norm;
use dormouse::fused::rope::{RopeTables, rope_heads};
use dormouse::fused::swiglu::{swiglu, swiglu_projections};
use dormouse::optim::AdamW;
use std::sync::Arc;

/// Reproducible values in about [-scale, scale] (a 64-bit LCG; candle's `randn` is seeded
/// from the OS).
fn noise(dims: &[usize], seed: u64, scale: f32) -> Tensor {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let count: usize = dims.iter().product();
    let values: Vec<f32> = (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(values, dims, &Device::Cpu).unwrap()
}

fn var(dims: &[usize], seed: u64, scale: f32) -> Var {
    Var::from_tensor(&noise(dims, seed, scale)).unwrap()
}

/// `max |a - b| / max(1, max |b|)`.
fn relative_gap(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
    let scale = b
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    diff.to_scalar::<f32>().unwrap() / scale.max(1.0)
}

/// The output of `fused` and of `reference` on `inputs`, and the gradients of
/// `sum(output x readout)` with respect to every input, agree to `tolerance`.
fn agree(
    inputs: &[Var],
    fused: impl Fn(&[Tensor]) -> Result<Tensor>,
    reference: impl Fn(&[Tensor]) -> Result<Tensor>,
    tolerance: f32,
) {
    let tensors: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
    let (ours, theirs) = (fused(&tensors).unwrap(), reference(&tensors).unwrap());
    let gap = relative_gap(&ours, &theirs);
    assert!(gap <= tolerance, "outputs differ by {gap}");
    let readout = noise(ours.dims(), 99, 1.0);
    let loss = |y: &Tensor| (y * &readout).unwrap().sum_all().unwrap();
    let (g_ours, g_theirs) = (
        loss(&ours).backward().unwrap(),
        loss(&theirs).backward().unwrap(),
    );
    for (i, input) in inputs.iter().enumerate() {
        let a = g_ours.get(input.as_tensor()).expect("a gradient");
        let b = g_theirs
            .get(input.as_tensor())
            .expect("a reference gradient");
        let gap = relative_gap(a, b);
        assert!(
            gap <= tolerance,
            "the gradient of input {i} differs by {gap}"
        );
    }
}

#[test]
fn rms_norm_and_its_gradients_match_the_primitive_form() {
    let inputs = [var(&[3, 5, 48], 1, 2.0), var(&[48], 2, 1.5)];
    agree(
        &inputs,
        |t| rms_norm(&t[0], &t[1], 1e-5),
        |t| {
            let mean_square = t[0].sqr()?.mean_keepdim(D::Minus1)?;
            let normed = t[0].broadcast_div(&(mean_square + 1e-5)?.sqrt()?)?;
            normed.broadcast_mul(&t[1])
        },
        2e-6,
    );
}

fn rope_tables(positions: usize, head_dim: usize) -> (Tensor, Tensor) {
    let half = head_dim / 2;
    let angles: Vec<f32> = (0..positions)
        .flat_map(|p| {
            (0..half).map(move |i| p as f32 / 10000f32.powf(2.0 * i as f32 / head_dim as f32))
        })
        .collect();
    let angles = Tensor::from_vec(angles, (positions, half), &Device::Cpu).unwrap();
    (angles.cos().unwrap(), angles.sin().unwrap())
}

/// The rotate-half RoPE of `x [B, H, T, Dh]` at positions `start..`, from primitives.
fn rope_reference(x: &Tensor, cos: &Tensor, sin: &Tensor, start: usize) -> Result<Tensor> {
    let (_, _, t, dh) = x.dims4()?;
    let (cos, sin) = (cos.narrow(0, start, t)?, sin.narrow(0, start, t)?);
    let x1 = x.narrow(D::Minus1, 0, dh / 2)?;
    let x2 = x.narrow(D::Minus1, dh / 2, dh / 2)?;
    let rotated_1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let rotated_2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
    Tensor::cat(&[rotated_1, rotated_2], D::Minus1)
}

fn split_heads(x: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, t, d) = x.dims3()?;
    x.reshape((b, t, heads, d / heads))?
        .transpose(1, 2)?
        .contiguous()
}

#[test]
fn rope_with_the_head_split_and_its_gradient_match_the_primitive_form() {
    let (heads, dh, start) = (3, 16, 5);
    let (cos, sin) = rope_tables(40, dh);
    let tables = Arc::new(RopeTables::new(&cos, &sin).unwrap());
    agree(
        &[var(&[2, 7, heads * dh], 3, 1.0)],
        |t| rope_heads(&t[0], &tables, heads, start),
        |t| rope_reference(&split_heads(&t[0], heads)?, &cos, &sin, start),
        1e-6,
    );
}

/// Causal attention from primitives: `[B, H, T, Dh]` queries at `start..` over `[B, H, S, Dh]`.
fn attention_reference(q: &Tensor, k: &Tensor, v: &Tensor, start: usize) -> Result<Tensor> {
    let (b, h, t, dh) = q.dims4()?;
    let keys = k.dim(2)?;
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| {
            (0..keys).map(move |j| {
                if j <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    let mask = Tensor::from_vec(mask, (t, keys), q.device())?;
    let scores = (q.matmul(&k.t()?)? / (dh as f64).sqrt())?.broadcast_add(&mask)?;
    let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
    weights.matmul(v)?.transpose(1, 2)?.reshape((b, t, h * dh))
}

#[test]
fn attention_and_its_gradients_match_the_primitive_form_for_every_head_size() {
    // Head sizes below, at and between the vector widths; a block starting mid-cache (its
    // queries see keys before it) and one starting at 0; query counts that leave tile
    // remainders.
    for (dh, t, start, seed) in [
        (16, 9, 0, 10),
        (64, 6, 3, 20),
        (24, 13, 0, 30),
        (8, 5, 11, 40),
    ] {
        let (b, h, keys) = (2, 3, start + t);
        let inputs = [
            var(&[b, h, t, dh], seed, 1.0),
            var(&[b, h, keys, dh], seed + 1, 1.0),
            var(&[b, h, keys, dh], seed + 2, 1.0),
        ];
        agree(
            &inputs,
            |x| causal_attention(&x[0], &x[1], &x[2], start),
            |x| attention_reference(&x[0], &x[1], &x[2], start),
            3e-6,
        );
    }
}

#[test]
fn swiglu_and_its_gradients_match_the_primitive_form() {
    agree(
        &[var(&[4, 70], 5, 6.0), var(&[4, 70], 6, 2.0)],
        |t| swiglu(&t[0], &t[1]),
        |t| t[0].silu()? * &t[1],
        2e-6,
    );
}

#[test]
fn the_swiglu_projections_and_their_gradients_match_the_primitive_form() {
    agree(
        &[
            var(&[2, 5, 24], 13, 1.0),
            var(&[40, 24], 14, 1.0),
            var(&[40, 24], 15, 1.0),
        ],
        |t| swiglu_projections(&t[0], &t[1], &t[2]),
        |t| {
            let gate = t[0].broadcast_matmul(&t[1].t()?)?;
            gate.silu()? * t[0].broadcast_matmul(&t[2].t()?)?
        },
        2e-6,
    );
}

#[test]
fn linear_and_its_gradients_match_the_primitive_form() {
    agree(
        &[var(&[2, 5, 24], 7, 1.0), var(&[10, 24], 8, 1.0)],
        |t| linear(&t[0], &t[1]),
        |t| t[0].broadcast_matmul(&t[1].t()?),
        1e-6,
    );
}

/// The products are candle's matmul on the same layouts, bit for bit (written into memory
/// that is not zeroed first): `y = x W^T`, `dx = g W`, `dW = g^T x`, and the MLP's two
/// projections, at the sizes of `small`'s layers and at odd ones.
#[test]
fn linear_and_swiglu_products_have_the_bits_of_candles_matmul() {
    for (rows, inputs, outputs) in [(64, 384, 1216), (37, 24, 10), (5, 1, 3)] {
        let x = var(&[rows, inputs], 21, 1.0);
        let (w, u) = (
            var(&[outputs, inputs], 22, 0.5),
            var(&[outputs, inputs], 23, 0.5),
        );
        let y = linear(x.as_tensor(), w.as_tensor()).unwrap();
        let want = x.as_tensor().matmul(&w.as_tensor().t().unwrap()).unwrap();
        assert_eq!(bits(&y), bits(&want), "{rows} x {inputs} x {outputs}");
        let g = noise(&[rows, outputs], 24, 1.0);
        let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
        let dx = g.matmul(w.as_tensor()).unwrap();
        let dw = g.t().unwrap().matmul(x.as_tensor()).unwrap();
        assert_eq!(bits(grads.get(x.as_tensor()).unwrap()), bits(&dx));
        assert_eq!(bits(grads.get(w.as_tensor()).unwrap()), bits(&dw));

        let gated = swiglu_projections(x.as_tensor(), w.as_tensor(), u.as_tensor()).unwrap();
        let pre = |m: &Var| x.as_tensor().matmul(&m.as_tensor().t().unwrap()).unwrap();
        let want = swiglu(&pre(&w), &pre(&u)).unwrap();
        assert_eq!(bits(&gated), bits(&want), "{rows} x {inputs} x {outputs}");
    }
}

#[test]
fn cross_entropy_and_its_gradient_match_candle_nn() {
    let targets: Vec<u32> = (0..12).map(|i| (i * 37 % 256) as u32).collect();
    let logits = var(&[12, 256], 9, 8.0);
    let ours = cross_entropy(logits.as_tensor(), targets.clone()).unwrap();
    let target_tensor = Tensor::from_vec(targets, 12, &Device::Cpu).unwrap();
    let theirs = candle_nn::loss::cross_entropy(logits.as_tensor(), &target_tensor).unwrap();
    assert!(relative_gap(&ours, &theirs) <= 1e-6);
    let (a, b) = (ours.backward().unwrap(), theirs.backward().unwrap());
    let gap = relative_gap(
        a.get(logits.as_tensor()).unwrap(),
        b.get(logits.as_tensor()).unwrap(),
    );
    assert!(gap <= 1e-6, "gradients differ by {gap}");
}

#[test]
fn bad_shapes_and_targets_are_refused_with_a_message() {
    let x = noise(&[2, 3, 8], 1, 1.0);
    let err = rms_norm(&x, &noise(&[7], 2, 1.0), 1e-5).unwrap_err();
    assert!(
        err.to_string().contains("a weight of 7 for rows of 8"),
        "{err}"
    );
    let err = cross_entropy(&noise(&[2, 4], 3, 1.0), vec![1, 4]).unwrap_err();
    assert!(err.to_string().contains("a target of 4"), "{err}");
    let err = linear(&x, &noise(&[4, 9], 4, 1.0)).unwrap_err();
    assert!(err.to_string().contains("linear map"), "{err}");
    let q = noise(&[1, 2, 3, 8], 5, 1.0);
    let err = causal_attention(&q, &noise(&[1, 2, 3, 4], 6, 1.0), &q, 0).unwrap_err();
    assert!(err.to_string().contains("attention of queries"), "{err}");
    let (cos, sin) = rope_tables(4, 8);
    let tables = Arc::new(RopeTables::new(&cos, &sin).unwrap());
    let err = rope_heads(&noise(&[1, 3, 16], 7, 1.0), &tables, 2, 2).unwrap_err();
    assert!(err.to_string().contains("past the RoPE tables"), "{err}");
    // Empty blocks are refused, not split into chunks of nothing.
    let err = rope_heads(&noise(&[1, 0, 16], 8, 1.0), &tables, 2, 0).unwrap_err();
    assert!(err.to_string().contains("RoPE over 2 heads"), "{err}");
    let none = noise(&[1, 2, 0, 8], 9, 1.0);
    let err = causal_attention(&none, &none, &none, 0).unwrap_err();
    assert!(err.to_string().contains("attention of queries"), "{err}");
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// The forward values and input gradients of the fused kernels of one small block.
fn block_bits() -> Vec<Vec<u32>> {
    let (heads, dh) = (4, 16);
    let (cos, sin) = rope_tables(64, dh);
    let tables = Arc::new(RopeTables::new(&cos, &sin).unwrap());
    let x = var(&[3, 37, heads * dh], 11, 1.0);
    let w = var(&[heads * dh], 12, 1.0);
    let normed = rms_norm(x.as_tensor(), w.as_tensor(), 1e-5).unwrap();
    let q = rope_heads(&normed, &tables, heads, 0).unwrap();
    let k = rope_heads(&(&normed * 0.5).unwrap(), &tables, heads, 0).unwrap();
    let v = split_heads(&normed, heads).unwrap();
    let attended = causal_attention(&q, &k, &v, 0).unwrap();
    let gated = swiglu(&attended, &normed).unwrap();
    let targets: Vec<u32> = (0..3 * 37).map(|i| (i % 64) as u32).collect();
    let loss = cross_entropy(&gated.reshape((3 * 37, heads * dh)).unwrap(), targets).unwrap();
    let grads = loss.backward().unwrap();
    vec![
        bits(&gated),
        bits(&loss),
        bits(grads.get(x.as_tensor()).unwrap()),
        bits(grads.get(w.as_tensor()).unwrap()),
    ]
}

#[test]
fn the_kernels_give_the_same_bits_on_one_and_two_threads() {
    let on = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(block_bits)
    };
    assert_eq!(on(1), on(2));
}

/// The gradients of `sum over params of (p x readout)^2`, each parameter's readout noise
/// seeded by `seed(its index)`.
fn readout_grads(params: &[(String, Var)], seed: impl Fn(usize) -> u64) -> GradStore {
    let loss = params
        .iter()
        .enumerate()
        .map(|(i, (_, p))| {
            (p.as_tensor() * noise(p.dims(), seed(i), 1.0))
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
        })
        .reduce(|a, b| (a + b).unwrap())
        .unwrap();
    loss.backward().unwrap()
}

/// The update `AdamW::update` documents, composed from tensor operations.
fn composed_adamw(
    (param, m, v): (&Tensor, &Tensor, &Tensor),
    grad: &Tensor,
    (lr, decay, clip, step): (f64, f64, f64, u64),
) -> Result<(Tensor, Tensor, Tensor)> {
    let (b1, b2, eps) = (
        dormouse::optim::BETA1,
        dormouse::optim::BETA2,
        dormouse::optim::EPS,
    );
    let grad = (grad * clip)?;
    let m = ((m * b1)? + (&grad * (1.0 - b1))?)?;
    let v = ((v * b2)? + (grad.sqr()? * (1.0 - b2))?)?;
    let m_hat = (&m / dormouse::optim::bias_correction(b1, step))?;
    let v_hat = (&v / dormouse::optim::bias_correction(b2, step))?;
    let update = (m_hat / (v_hat.sqrt()? + eps)?)?;
    let param = ((param * (1.0 - lr * decay))? - (update * lr)?)?;
    Ok((param, m, v))
}

#[test]
fn the_in_place_adamw_update_has_the_bits_of_the_composed_update() {
    let params = vec![
        ("matrix".to_string(), var(&[9, 13], 21, 1.0)),
        ("norm".to_string(), var(&[13], 22, 1.0)),
    ];
    let mut optim = AdamW::new(&params).unwrap();
    let mut expected: Vec<(Tensor, Tensor, Tensor)> = params
        .iter()
        .map(|(_, p)| {
            let t = p.as_tensor().copy().unwrap();
            (t.clone(), t.zeros_like().unwrap(), t.zeros_like().unwrap())
        })
        .collect();
    let (lr, decay, clip) = (3e-3, 0.01, 0.7);
    for step in 1..=3u64 {
        let grads = readout_grads(&params, |i| 30 + step * 2 + i as u64);
        for ((_, p), state) in params.iter().zip(expected.iter_mut()) {
            let grad = grads.get(p.as_tensor()).unwrap();
            let decay = if p.rank() > 1 { decay } else { 0.0 };
            let (param, m, v) = (&state.0, &state.1, &state.2);
            *state = composed_adamw((param, m, v), grad, (lr, decay, clip, step)).unwrap();
        }
        optim.update(&params, &grads, lr, decay, clip).unwrap();
        for (i, ((_, p), state)) in params.iter().zip(&expected).enumerate() {
            assert_eq!(
                bits(p.as_tensor()),
                bits(&state.0),
                "parameter {i}, step {step}"
            );
            assert_eq!(
                bits(&optim.m[i]),
                bits(&state.1),
                "first moment {i}, step {step}"
            );
            assert_eq!(
                bits(&optim.v[i]),
                bits(&state.2),
                "second moment {i}, step {step}"
            );
        }
    }
}

/// AdamW with the average in the same pass gives the bits of AdamW and then the average's
/// own pass, parameters, moments and average alike, and a parameter without a gradient is
/// averaged unchanged.
#[test]
fn adamw_with_the_average_in_its_pass_has_the_bits_of_the_two_passes() {
    let fresh = || {
        vec![
            ("matrix".to_string(), var(&[300, 200], 41, 1.0)),
            ("norm".to_string(), var(&[200], 42, 1.0)),
            ("unused".to_string(), var(&[7], 43, 1.0)),
        ]
    };
    let (one_pass, two_passes) = (fresh(), fresh());
    let (mut fused, mut plain) = (
        AdamW::new(&one_pass).unwrap(),
        AdamW::new(&two_passes).unwrap(),
    );
    let average = |params: &[(String, Var)]| -> Vec<Tensor> {
        params
            .iter()
            .map(|(_, p)| (p.as_tensor() * 0.5).unwrap())
            .collect()
    };
    let (fused_ema, mut plain_ema) = (average(&one_pass), average(&two_passes));
    // The third parameter is left out of the loss: it gets no gradient.
    let grads_of = |params: &[(String, Var)], step: u64| readout_grads(&params[..2], |_| 50 + step);
    for step in 1..=3 {
        let settings = (2e-3, 0.1, 0.9);
        let grads = grads_of(&one_pass, step);
        fused
            .update_with_average(&one_pass, &grads, settings, &fused_ema, 0.99)
            .unwrap();
        let grads = grads_of(&two_passes, step);
        plain.update(&two_passes, &grads, 2e-3, 0.1, 0.9).unwrap();
        dormouse::train::update_ema(&mut plain_ema, &two_passes, 0.99).unwrap();
        for i in 0..3 {
            let (a, b) = (one_pass[i].1.as_tensor(), two_passes[i].1.as_tensor());
            assert_eq!(bits(a), bits(b), "parameter {i}, step {step}");
            assert_eq!(bits(&fused.m[i]), bits(&plain.m[i]), "moment {i}");
            assert_eq!(bits(&fused.v[i]), bits(&plain.v[i]), "moment {i}");
            assert_eq!(bits(&fused_ema[i]), bits(&plain_ema[i]), "average {i}");
        }
    }
    assert_ne!(bits(&fused_ema[2]), bits(&average(&fresh())[2]));
}
