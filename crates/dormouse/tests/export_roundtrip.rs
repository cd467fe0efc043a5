//! Every claim `export run` and the loader make, asserted: f32 reproduces the checkpoint's
//! logits bit for bit; f16 and bf16 stay within a measured tolerance; the file is the header
//! plus exactly 2 bytes per parameter; the header carries the config and every tensor's name
//! and dims; a flipped payload bit, a tampered header and a training checkpoint are refused
//! (the last with a command that works); f16 refuses a weight above 65504 that bf16 accepts;
//! the optimizer section and the `.ngram` sidecar are never read.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use candle_core::{Device, Tensor};
use dmexp::Dtype;
use dormouse::DormouseConfig;
use dormouse::checkpoint::{Checkpoint, SectionKind};
use dormouse::data::Corpus;
use dormouse::export::{ExportError, ExportRequest, export_run};
use dormouse::serving::{ServeError, load_export};
use dormouse::tensor_shapes::expected_tensors;
use dormouse::train::{TrainSettings, Trainer};

const WINDOWS: [&[u8]; 3] = [
    b"In the beginning God created the heaven and the earth.",
    b"And the earth was without form, and void; and darkness ",
    b"was upon the face of the deep. And the Spirit of God mo",
];

fn corpus() -> Corpus {
    let text = dormouse::data::EMBEDDED_CORPUS[..200_000].to_vec();
    Corpus::new(text, 4_096, 64).unwrap()
}

/// Trains `cfg` for a few steps and saves the run as `<dir>/latest.bin` + snapshot.
fn trained_run(dir: &Path, cfg: &DormouseConfig, steps: u64) -> Trainer {
    let settings = TrainSettings {
        steps,
        batch: 4,
        seq: 64,
        warmup: 2,
        eval_bytes: 4_096,
        ..TrainSettings::default()
    };
    let mut run = Trainer::new(cfg, settings, &Device::Cpu).unwrap();
    let corpus = corpus();
    for _ in 0..steps {
        run.train_step(&corpus).unwrap();
    }
    run.save(&dir.join("latest.bin")).unwrap();
    fs::write(dir.join("latest.config.toml"), cfg.to_toml()).unwrap();
    run
}

fn request(dir: &Path, dtype: Dtype) -> ExportRequest {
    ExportRequest {
        ckpt_dir: dir.to_path_buf(),
        ckpt_name: "latest".into(),
        dtype,
        out: None,
        preset: None,
    }
}

fn logits(model: &dormouse::Dormouse) -> Tensor {
    let windows: Vec<&[u8]> = WINDOWS.iter().map(|w| &w[..48]).collect();
    model.forward(&windows, None).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

fn max_abs_delta(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap();
    d.max(0).unwrap().to_scalar::<f32>().unwrap()
}

#[test]
fn f32_is_bit_exact_and_the_narrow_formats_are_close_and_exactly_two_bytes_per_param() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = DormouseConfig::preset("nano").unwrap();
    let run = trained_run(dir.path(), &cfg, 30);
    let reference = logits(&run.model);
    let params: u64 = expected_tensors(&cfg)
        .unwrap()
        .values()
        .map(|d| d.iter().product::<u64>())
        .sum();

    let f32_export = export_run(&request(dir.path(), Dtype::F32)).unwrap();
    assert_eq!(
        f32_export.out,
        dir.path().join("latest.f32.dmexp"),
        "default --out"
    );
    let served = load_export(&f32_export.out, &Device::Cpu).unwrap();
    assert!(
        bits(&logits(&served.model)) == bits(&reference),
        "f32 logits bit for bit"
    );

    // Tolerances: measured on this 30-step nano run, max |delta| f16 3.8e-4 and bf16 4.7e-3;
    // the bounds leave 5x headroom. A narrowing bug (truncation instead of rounding, swapped
    // bytes) moves logits by far more.
    for (dtype, tolerance) in [(Dtype::F16, 2e-3), (Dtype::Bf16, 2.5e-2)] {
        let done = export_run(&request(dir.path(), dtype)).unwrap();
        let header_len = u64::from(done.written.prefix.header_len);
        assert_eq!(
            fs::metadata(&done.out).unwrap().len(),
            24 + header_len + 2 * params
        );
        let served = load_export(&done.out, &Device::Cpu).unwrap();
        let delta = max_abs_delta(&logits(&served.model), &reference);
        eprintln!("{dtype:?}: max |delta logit| {delta}");
        assert!(
            delta > 0.0 && delta < tolerance,
            "{dtype:?}: max |delta logit| {delta}"
        );
    }
}

#[test]
fn the_header_carries_the_config_step_source_and_every_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = DormouseConfig::preset("nano").unwrap();
    trained_run(dir.path(), &cfg, 3);
    let done = export_run(&request(dir.path(), Dtype::Bf16)).unwrap();
    let header = dmexp::info(&done.out).unwrap();
    let file = dmexp::DmexpFile::open(&done.out).unwrap();
    let h = file.header();
    assert_eq!(dormouse::serving::config_of(h).unwrap(), cfg);
    assert_eq!(h.step, 3);
    assert!(h.source.ends_with("latest.bin@step3"), "{}", h.source);
    let listed: std::collections::BTreeMap<String, Vec<u64>> = h
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone()))
        .collect();
    assert_eq!(listed, expected_tensors(&cfg).unwrap());
    assert!(listed.contains_key("blocks.0.attn.q_proj.weight"));
    assert_eq!(listed["engram.order2.table"], vec![1024, 16]);
    assert_eq!(header.tensors.len(), h.tensors.len());
}

#[test]
fn a_flipped_payload_bit_and_a_tampered_header_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path(), &DormouseConfig::preset("nano").unwrap(), 2);
    let done = export_run(&request(dir.path(), Dtype::Bf16)).unwrap();
    let clean = fs::read(&done.out).unwrap();

    let mut flipped = clean.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 0x01;
    let path = dir.path().join("flipped.dmexp");
    fs::write(&path, &flipped).unwrap();
    let err = load_export(&path, &Device::Cpu).unwrap_err();
    assert!(
        matches!(
            &err,
            ServeError::Export {
                error: dmexp::Error::ChecksumMismatch { .. },
                ..
            }
        ),
        "{err}"
    );

    // The CRC covers the payload only: a header edit keeps it valid, and the shape check is
    // what refuses a config that no longer fits the tensors.
    let header_len = u32::from_le_bytes(clean[8..12].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&clean[24..24 + header_len]).unwrap();
    let tampered_header = header.replace("mlp_hidden = 192", "mlp_hidden = 128");
    assert_ne!(tampered_header, header);
    let mut tampered = clean[..24].to_vec();
    tampered.extend_from_slice(tampered_header.as_bytes());
    tampered.extend_from_slice(&clean[24 + header_len..]);
    let path = dir.path().join("tampered.dmexp");
    fs::write(&path, &tampered).unwrap();
    let err = load_export(&path, &Device::Cpu).unwrap_err();
    assert!(matches!(err, ServeError::Mismatch { .. }), "{err}");
    assert!(err.to_string().contains("mlp.down_proj.weight"), "{err}");
}

#[test]
fn a_training_checkpoint_is_refused_with_an_export_command_that_works() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path(), &DormouseConfig::preset("nano").unwrap(), 2);
    let bin = dir.path().join("latest.bin");
    let message = load_export(&bin, &Device::Cpu).unwrap_err().to_string();
    assert!(message.contains("TRAINING CHECKPOINT"), "{message}");
    let command = message
        .split("convert it with: ")
        .nth(1)
        .expect("a command")
        .trim();
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(&words[..3], ["dormouse", "export", "run"]);
    let flag = |name: &str| {
        let at = words.iter().position(|w| *w == name).expect(name);
        words[at + 1].to_string()
    };
    let req = ExportRequest {
        ckpt_dir: PathBuf::from(flag("--ckpt-dir")),
        ckpt_name: flag("--ckpt-name"),
        dtype: flag("--dtype").parse().unwrap(),
        out: None,
        preset: None,
    };
    let done = export_run(&req).unwrap();
    load_export(&done.out, &Device::Cpu).unwrap();
}

#[test]
fn f16_refuses_a_weight_above_65504_that_bf16_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = DormouseConfig::preset("nano").unwrap();
    let run = trained_run(dir.path(), &cfg, 1);
    let var = run
        .varmap
        .data()
        .lock()
        .unwrap()
        .get("blocks.1.mlp.up_proj.weight")
        .cloned()
        .unwrap();
    let mut values = var
        .as_tensor()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    values[5] = 70_000.0;
    var.set(&Tensor::from_vec(values, var.dims(), &Device::Cpu).unwrap())
        .unwrap();
    run.save(&dir.path().join("latest.bin")).unwrap();

    let err = export_run(&request(dir.path(), Dtype::F16)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("blocks.1.mlp.up_proj.weight") && text.contains("bf16"),
        "{text}"
    );
    assert!(
        !dir.path().join("latest.f16.dmexp").exists(),
        "nothing half-written"
    );
    let done = export_run(&request(dir.path(), Dtype::Bf16)).unwrap();
    assert_eq!(
        done.written.header.max_abs, 70_144.0,
        "70000 rounded to bf16"
    );
}

/// Flips a byte inside the optimizer and EMA sections: reading either would fail its CRC.
fn damage_training_state(bin: &Path) {
    let entries = Checkpoint::open(bin).unwrap().entries().to_vec();
    let mut bytes = fs::read(bin).unwrap();
    for entry in entries {
        if matches!(entry.kind, SectionKind::Optimizer | SectionKind::Ema) {
            bytes[(entry.offset + entry.len / 2) as usize] ^= 0xFF;
        }
    }
    fs::write(bin, bytes).unwrap();
}

#[test]
fn export_reads_neither_the_optimizer_nor_the_ema_nor_the_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path(), &DormouseConfig::preset("nano").unwrap(), 2);
    let bin = dir.path().join("latest.bin");
    damage_training_state(&bin);
    let ckpt = Checkpoint::open(&bin).unwrap();
    assert!(
        ckpt.read(SectionKind::Optimizer).is_err(),
        "the damage is real"
    );
    // A FIFO blocks whoever opens it for reading until a writer comes: an export that looked
    // at the sidecar would hang here instead of finishing.
    let sidecar = dir.path().join("latest.ngram");
    let made = std::process::Command::new("mkfifo")
        .arg(&sidecar)
        .status()
        .unwrap();
    assert!(made.success());
    let req = request(dir.path(), Dtype::Bf16);
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || done.send(export_run(&req).map(|e| e.out)));
    let out = finished
        .recv_timeout(Duration::from_secs(60))
        .expect("export finished without opening the sidecar")
        .unwrap();
    load_export(&out, &Device::Cpu).unwrap();
}

#[test]
fn an_engram_ram_run_exports_its_in_model_tables_only_and_is_refused_for_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = DormouseConfig::preset("nano").unwrap();
    cfg.engram_ram = true;
    cfg.engram_slots = 4096;
    let cfg = cfg.resolve().unwrap();
    trained_run(dir.path(), &cfg, 2);
    let sidecar = dir.path().join("latest.ngram");
    assert!(fs::metadata(&sidecar).unwrap().len() > 4096 * 16 * 4);
    fs::remove_file(&sidecar).unwrap();
    let done = export_run(&request(dir.path(), Dtype::Bf16)).unwrap();
    let file = dmexp::DmexpFile::open(&done.out).unwrap();
    assert_eq!(
        file.header().require("engram.order2.table").unwrap().dims,
        [1, 16]
    );
    let err = load_export(&done.out, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--engram-ram") && err.contains(".ngram"),
        "{err}"
    );
}

#[test]
fn the_config_comes_from_the_snapshot_and_a_preset_only_as_a_declared_guess() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path(), &DormouseConfig::preset("nano").unwrap(), 1);
    let with_preset = ExportRequest {
        preset: Some("nano".into()),
        ..request(dir.path(), Dtype::Bf16)
    };
    assert!(matches!(
        export_run(&with_preset),
        Err(ExportError::PresetWithSnapshot { .. })
    ));
    fs::remove_file(dir.path().join("latest.config.toml")).unwrap();
    assert!(matches!(
        export_run(&request(dir.path(), Dtype::Bf16)),
        Err(ExportError::NoSnapshot { .. })
    ));
    let guessed = export_run(&with_preset).unwrap();
    assert!(
        guessed
            .written
            .header
            .source
            .contains("guessed from preset nano")
    );
    let wrong_guess = ExportRequest {
        preset: Some("small".into()),
        ..request(dir.path(), Dtype::Bf16)
    };
    let err = export_run(&wrong_guess).unwrap_err();
    assert!(matches!(err, ExportError::Mismatch { .. }), "{err}");
}

/// An existing `--out` is replaced only when it is an earlier export (or empty): another run's
/// checkpoint under another name, or any other file, is refused and left as it was.
#[test]
fn an_out_holding_something_other_than_an_export_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path(), &DormouseConfig::preset("nano").unwrap(), 2);
    let other_run = dir.path().join("other.bin");
    std::fs::copy(dir.path().join("latest.bin"), &other_run).unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "my notes, not an export\n").unwrap();
    for (out, kind) in [
        (&other_run, "dormouse-training-checkpoint"),
        (&notes, "unknown"),
    ] {
        let before = std::fs::read(out).unwrap();
        let req = ExportRequest {
            out: Some(out.clone()),
            ..request(dir.path(), Dtype::Bf16)
        };
        let err = export_run(&req).unwrap_err();
        assert!(matches!(err, ExportError::OutNotAnExport { .. }), "{err}");
        assert!(err.to_string().contains(kind), "{err}");
        assert_eq!(
            std::fs::read(out).unwrap(),
            before,
            "{} untouched",
            out.display()
        );
    }
    // An earlier export, and an empty file, are replaced.
    let out = dir.path().join("model.dmexp");
    for _ in 0..2 {
        let req = ExportRequest {
            out: Some(out.clone()),
            ..request(dir.path(), Dtype::Bf16)
        };
        export_run(&req).unwrap();
    }
    let empty = dir.path().join("empty.dmexp");
    std::fs::write(&empty, b"").unwrap();
    let req = ExportRequest {
        out: Some(empty.clone()),
        ..request(dir.path(), Dtype::Bf16)
    };
    export_run(&req).unwrap();
    assert!(std::fs::metadata(&empty).unwrap().len() > 0);
}

#[test]
fn an_out_that_is_the_run_itself_or_not_a_regular_file_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path(), &DormouseConfig::preset("nano").unwrap(), 2);
    let bin = dir.path().join("latest.bin");
    let snapshot = dir.path().join("latest.config.toml");
    let linked = dir.path().join("another-name.dmexp");
    std::fs::hard_link(&bin, &linked).unwrap();
    let before = std::fs::read(&bin).unwrap();
    for (out, what) in [
        (bin.clone(), "checkpoint"),
        (snapshot.clone(), "config snapshot"),
        (linked, "checkpoint"),
    ] {
        let req = ExportRequest {
            out: Some(out.clone()),
            ..request(dir.path(), Dtype::Bf16)
        };
        let err = export_run(&req).unwrap_err().to_string();
        assert!(err.contains(&format!("the run's own {what}")), "{err}");
    }
    assert_eq!(std::fs::read(&bin).unwrap(), before, "the run is untouched");
    assert!(
        std::fs::read_to_string(&snapshot)
            .unwrap()
            .contains("d_model")
    );

    let fifo = dir.path().join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for (out, kind) in [
        (fifo.clone(), "a FIFO"),
        (dir.path().join("."), "a directory"),
    ] {
        let req = ExportRequest {
            out: Some(out),
            ..request(dir.path(), Dtype::Bf16)
        };
        let err = export_run(&req).unwrap_err().to_string();
        assert!(
            err.contains(kind) && err.contains("not a regular file"),
            "{err}"
        );
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );
}
