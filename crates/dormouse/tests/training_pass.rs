//! The written-out training pass (`Dormouse::loss_and_gradients`) gives the loss of
//! `train::batch_loss` and every gradient candle's autograd gives, with the same bits
//! (compared with `==`, under which a zero's sign does not count): tied and untied heads,
//! the Engram read at the first or a later block, and an `--engram-ram` run's host rows.

use candle_core::{Device, Tensor, Var};
use dormouse::DormouseConfig;
use dormouse::data::Corpus;
use dormouse::init::{seeded_model, sorted_vars};
use dormouse::train::batch_loss;

fn corpus() -> Corpus {
    let text: Vec<u8> =
        b"Alice was beginning to get very tired of sitting by her sister on the bank, \
        and of having nothing to do: once or twice she had peeped into the book. "
            .iter()
            .copied()
            .cycle()
            .take(20_000)
            .collect();
    Corpus::new(text, 2_000, 48).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Inputs (all but each window's last byte) and targets (all but its first).
fn split(windows: &[&[u8]]) -> (Vec<Vec<u8>>, Vec<u32>) {
    let inputs = windows.iter().map(|w| w[..w.len() - 1].to_vec()).collect();
    let targets = windows
        .iter()
        .flat_map(|w| w[1..].iter().map(|&b| u32::from(b)))
        .collect();
    (inputs, targets)
}

/// Both passes over one batch of `cfg`'s seeded model; every parameter's gradient compared.
fn assert_same_as_autograd(cfg: &DormouseConfig) {
    let (varmap, model) = seeded_model(cfg, 11, &Device::Cpu).unwrap();
    let corpus = corpus();
    let windows = corpus.batch(3, 0, 4, 48);
    let reference = batch_loss(&model, &windows, None).unwrap();
    let expected = reference.loss.backward().unwrap();
    let (inputs, targets) = split(&windows);
    let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let pass = model.loss_and_gradients(&inputs, targets, None).unwrap();
    assert_eq!(
        values(&pass.loss)[0].to_bits(),
        values(&reference.loss)[0].to_bits()
    );
    let vars = sorted_vars(&varmap).unwrap();
    assert!(vars.len() > 10);
    for (name, var) in &vars {
        let want = values(expected.get(var.as_tensor()).unwrap());
        let got = values(pass.grads.get(var.as_tensor()).unwrap());
        assert_eq!(got.len(), want.len(), "{name}");
        let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "{name}: {differing} of {} differ", got.len());
    }
}

#[test]
fn nano_gradients_are_autograds() {
    assert_same_as_autograd(&DormouseConfig::preset("nano").unwrap());
}

#[test]
fn an_untied_head_and_a_later_engram_read_get_autograds_gradients() {
    let cfg = DormouseConfig {
        tie_embeddings: false,
        n_layers: 3,
        engram_layers: vec![1, 2],
        ..DormouseConfig::preset("nano").unwrap()
    };
    assert_same_as_autograd(&cfg);
}

#[test]
fn a_model_without_engram_gets_autograds_gradients() {
    let cfg = DormouseConfig {
        use_engram: false,
        ..DormouseConfig::preset("nano").unwrap()
    };
    assert_same_as_autograd(&cfg.resolve().unwrap());
}

#[test]
fn host_memory_rows_get_autograds_gradient() {
    let mut cfg = DormouseConfig::preset("nano").unwrap();
    cfg.engram_ram = true;
    let cfg = cfg.resolve().unwrap();
    let (varmap, model) = seeded_model(&cfg, 4, &Device::Cpu).unwrap();
    let corpus = corpus();
    let windows = corpus.batch(9, 1, 3, 32);
    let (inputs, targets) = split(&windows);
    let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let width = cfg.engram_orders.len() * cfg.engram_dim;
    let rows = Var::randn(0f32, 0.02, (3, 32, width), &Device::Cpu).unwrap();

    let logits = model
        .forward_with_memory(&inputs, rows.as_tensor())
        .unwrap();
    let reference = dormouse::fused::cross_entropy::cross_entropy(
        &logits.reshape(((), 256)).unwrap(),
        targets.clone(),
    )
    .unwrap();
    let expected = reference.backward().unwrap();
    let pass = model
        .loss_and_gradients(&inputs, targets, Some(&rows))
        .unwrap();
    assert!(pass.grads.get(rows.as_tensor()).is_some());
    assert_eq!(
        values(&pass.loss)[0].to_bits(),
        values(&reference)[0].to_bits()
    );
    for (name, var) in sorted_vars(&varmap)
        .unwrap()
        .iter()
        .map(|(n, v)| (n.as_str(), v))
        .chain([("host rows", &rows)])
    {
        // The model's own one-row tables are not read on such a run: no gradient either way.
        let want = expected.get(var.as_tensor()).map(values);
        let got = pass.grads.get(var.as_tensor()).map(values);
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn batches_the_model_cannot_take_are_refused_by_name() {
    let cfg = DormouseConfig::preset("nano").unwrap();
    let (_, model) = seeded_model(&cfg, 1, &Device::Cpu).unwrap();
    let ragged: [&[u8]; 2] = [b"abc", b"ab"];
    let err = model
        .loss_and_gradients(&ragged, vec![1; 5], None)
        .err()
        .unwrap();
    assert!(err.to_string().contains("same non-zero length"), "{err}");
    let even: [&[u8]; 2] = [b"abc", b"abd"];
    let err = model
        .loss_and_gradients(&even, vec![1; 5], None)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("6 rows against 5 targets"),
        "{err}"
    );
    let long = vec![b'a'; cfg.max_seq_len + 1];
    let err = model
        .loss_and_gradients(&[&long], vec![1; long.len()], None)
        .err()
        .unwrap();
    assert!(err.to_string().contains("past max_seq_len"), "{err}");
    let plain = DormouseConfig {
        use_engram: false,
        ..cfg.clone()
    }
    .resolve()
    .unwrap();
    let (_, plain_model) = seeded_model(&plain, 1, &Device::Cpu).unwrap();
    let rows = Var::zeros((2, 3, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
    let err = plain_model
        .loss_and_gradients(&even, vec![1; 6], Some(&rows))
        .err()
        .unwrap();
    assert!(err.to_string().contains("no Engram memory"), "{err}");
}
