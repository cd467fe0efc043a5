//! The model: preset sizes, tensor names, config refusals, and incremental decoding with the
//! KV cache computing the same function as the full forward pass.

use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::{VarBuilder, VarMap};
use dormouse::{ConfigReadError, Dormouse, DormouseConfig, KvCache};

fn build(cfg: &DormouseConfig) -> (VarMap, Dormouse) {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = Dormouse::new(cfg, vb).unwrap();
    (varmap, model)
}

fn param_count(varmap: &VarMap) -> usize {
    varmap.all_vars().iter().map(|v| v.elem_count()).sum()
}

#[test]
fn presets_have_the_documented_sizes() {
    let nano = DormouseConfig::preset("nano").unwrap();
    let (vm, _) = build(&nano);
    let n = param_count(&vm);
    assert!(n <= 300_000, "nano has {n} params");

    let small = DormouseConfig::preset("small").unwrap();
    assert_eq!(
        small,
        DormouseConfig::default(),
        "the defaults are the small preset"
    );
    let (vm, _) = build(&small);
    let data = vm.data().lock().unwrap();
    let total: usize = data.values().map(|v| v.elem_count()).sum();
    let memory: usize = data
        .iter()
        .filter(|(k, _)| k.ends_with(".table"))
        .map(|(_, v)| v.elem_count())
        .sum();
    assert_eq!(memory, 2 * 49_152 * 32);
    assert!(
        (9_000_000..9_400_000).contains(&total),
        "small has {total} params"
    );
    assert!(
        (5_900_000..6_200_000).contains(&(total - memory)),
        "small computes with {} params",
        total - memory
    );
}

#[test]
fn tensor_names_are_the_documented_module_paths() {
    let cfg = DormouseConfig {
        tie_embeddings: false,
        ..DormouseConfig::preset("nano").unwrap()
    };
    let (vm, _) = build(&cfg);
    let data = vm.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for expected in [
        "embed.weight",
        "engram.order2.table",
        "engram.order3.table",
        "blocks.0.engram.proj.weight",
        "blocks.0.engram.gate.weight",
        "blocks.0.engram.gate.bias",
        "blocks.0.attn_norm.weight",
        "blocks.0.attn.q_proj.weight",
        "blocks.1.attn.o_proj.weight",
        "blocks.1.mlp.down_proj.weight",
        "blocks.1.mlp_norm.weight",
        "norm.weight",
        "lm_head.weight",
    ] {
        assert!(
            data.contains_key(expected),
            "missing {expected} in {names:?}"
        );
    }
    assert!(
        !data.contains_key("blocks.1.engram.proj.weight"),
        "only engram_layers read memory"
    );
    assert_eq!(data["blocks.0.engram.proj.weight"].dims(), &[64, 2 * 16]);
}

#[test]
fn invalid_configs_are_refused_naming_the_field() {
    let cases = [
        ("vocab_size = 512", "vocab_size"),
        ("n_heads = 5", "n_heads"),
        ("engram_hash = \"fnv\"", "engram_hash"),
        ("engram_orders = [2, 2]", "engram_orders"),
        ("engram_layers = [7]", "engram_layers"),
        ("norm_eps = 0.0", "norm_eps"),
        ("d_model = 0", "d_model"),
        ("d_model = 1000002", "d_model"),
        ("max_seq_len = 1000000", "max_seq_len"),
        ("engram_rows = 4000000000", "engram_rows"),
    ];
    for (line, field) in cases {
        match DormouseConfig::from_toml(line) {
            Err(ConfigReadError::Invalid(e)) => assert_eq!(e.field, field, "{line}"),
            other => panic!("{line}: expected a refusal naming {field}, got {other:?}"),
        }
    }
    assert!(
        matches!(
            DormouseConfig::from_toml("d_modle = 64"),
            Err(ConfigReadError::Toml(_))
        ),
        "typos are refused"
    );
    assert!(matches!(
        DormouseConfig::preset("huge"),
        Err(ConfigReadError::NoSuchPreset { .. })
    ));
}

/// The KV cache changes nothing a sampler could see: over a 256-byte sequence, decoding byte by
/// byte with the cache gives the full forward pass's logits (max |delta| <= 1e-5) and the same
/// argmax everywhere.
#[test]
fn incremental_decoding_matches_the_full_forward() {
    let cfg = DormouseConfig::preset("nano").unwrap();
    let (_vm, model) = build(&cfg);
    let text: Vec<u8> = b"Alice was beginning to get very tired of sitting by her sister on the bank, and of having \
        nothing to do: once or twice she had peeped into the book her sister was reading, but it had no pictures \
        or conversations in it, 'and what is the use of a book,' thought Alice 'without pictures or conversations?'"
        .iter()
        .copied()
        .cycle()
        .take(256)
        .collect();
    let full = model.forward(&[&text], None).unwrap().i(0).unwrap();
    let mut cache = KvCache::new(&cfg);
    let mut steps = Vec::new();
    // A prompt of 17 bytes at once, then one byte at a time.
    steps.push(
        model
            .forward(&[&text[..17]], Some(&mut cache))
            .unwrap()
            .i(0)
            .unwrap(),
    );
    for i in 17..text.len() {
        steps.push(
            model
                .forward(&[&text[i..i + 1]], Some(&mut cache))
                .unwrap()
                .i(0)
                .unwrap(),
        );
    }
    let incremental = Tensor::cat(&steps, 0).unwrap();
    assert_eq!(cache.position(), 256);
    let delta = (&full - &incremental)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(delta <= 1e-5, "max |delta| = {delta}");
    let argmax = |t: &Tensor| t.argmax(1).unwrap().to_vec1::<u32>().unwrap();
    assert_eq!(argmax(&full), argmax(&incremental));
}

#[test]
fn outputs_are_causal_and_depend_on_the_last_byte() {
    let cfg = DormouseConfig {
        n_layers: 1,
        ..DormouseConfig::preset("nano").unwrap()
    };
    let (_vm, model) = build(&cfg);
    let last = |text: &[u8]| {
        model
            .forward(&[text], None)
            .unwrap()
            .i((0, text.len() - 1))
            .unwrap()
    };
    let base = last(b"xyzab").to_vec1::<f32>().unwrap();
    assert_ne!(
        base,
        last(b"xyzac").to_vec1::<f32>().unwrap(),
        "the last byte matters"
    );
    // Changing an early byte changes attention but the logits must stay finite and causal:
    // a later byte never changes an earlier position's logits.
    let a = model
        .forward(&[b"hello world"], None)
        .unwrap()
        .i((0, 4))
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let b = model
        .forward(&[b"hello WORLD"], None)
        .unwrap()
        .i((0, 4))
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(a, b, "position 4 cannot see bytes after it");
}

#[test]
fn batches_and_bounds_are_checked() {
    let cfg = DormouseConfig::preset("nano").unwrap();
    let (_vm, model) = build(&cfg);
    let logits = model.forward(&[b"abc", b"xyz"], None).unwrap();
    assert_eq!(logits.dims(), &[2, 3, 256]);
    assert!(
        model.forward(&[b"abc", b"xy"], None).is_err(),
        "ragged batch"
    );
    let long = vec![b'a'; cfg.max_seq_len + 1];
    assert!(model.forward(&[&long], None).is_err(), "past max_seq_len");
}

/// The forward function is differentiable end to end: every parameter, the memory tables
/// included, receives a gradient from a next-byte loss. (Candle's fused RMSNorm, RoPE and
/// softmax kernels have no backward pass, which is why the model does not use them.)
#[test]
fn every_parameter_gets_a_gradient_through_the_one_forward() {
    let cfg = DormouseConfig {
        tie_embeddings: false,
        ..DormouseConfig::preset("nano").unwrap()
    };
    let (vm, model) = build(&cfg);
    let text = b"the cat sat on the mat";
    let logits = model.forward(&[&text[..text.len() - 1]], None).unwrap();
    let targets: Vec<u32> = text[1..].iter().map(|&b| u32::from(b)).collect();
    let targets = Tensor::new(targets.as_slice(), &Device::Cpu).unwrap();
    let loss = candle_nn::loss::cross_entropy(&logits.i(0).unwrap(), &targets).unwrap();
    let grads = loss.backward().unwrap();
    for (name, var) in vm.data().lock().unwrap().iter() {
        let grad = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        assert_eq!(grad.dims(), var.dims(), "{name}");
    }
}
