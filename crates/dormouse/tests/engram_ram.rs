//! `--engram-ram` runs: the memory lives in a host-RAM table saved as the `.ngram` sidecar.
//! Resuming is the same run bit for bit (sidecar included), a save killed between its two
//! renames rolls forward, and a sidecar of another step, shape or content is refused.

use std::fs;
use std::path::Path;

use candle_core::{Device, Tensor};
use dormouse::DormouseConfig;
use dormouse::data::Corpus;
use dormouse::engram::memory::MemoryShape;
use dormouse::engram::sidecar::{self, SidecarError, SidecarStamp};
use dormouse::train::{RunError, TrainSettings, Trainer};

fn corpus() -> Corpus {
    let text: Vec<u8> = b"a stitch in time saves nine; nine lives has a cat. "
        .iter()
        .copied()
        .cycle()
        .take(12_000)
        .collect();
    Corpus::new(text, 1_000, 24).unwrap()
}

fn ram_config(slots: usize) -> DormouseConfig {
    let mut cfg = DormouseConfig::preset("nano").unwrap();
    cfg.engram_ram = true;
    cfg.engram_slots = slots;
    cfg.resolve().unwrap()
}

fn settings(steps: u64) -> TrainSettings {
    TrainSettings {
        steps,
        batch: 2,
        seq: 24,
        warmup: 2,
        eval_bytes: 1_000,
        seed: 5,
        ..TrainSettings::default()
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    let values = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    values.into_iter().map(f32::to_bits).collect()
}

/// Named tensors as bits; the other tensors of the run as bits; the host memory's payload.
type RunState = (Vec<(String, Vec<u32>)>, Vec<Vec<u32>>, Vec<u8>);

/// Every tensor of the run and the host memory's payload, as bits.
fn state(t: &Trainer) -> RunState {
    let mut vars: Vec<(String, Vec<u32>)> = t
        .varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), bits(v.as_tensor())))
        .collect();
    vars.sort();
    let rest = t.optim.m.iter().chain(&t.optim.v).chain(&t.ema);
    let host = t
        .host
        .as_ref()
        .expect("an engram-ram run")
        .payload()
        .to_vec();
    (vars, rest.map(bits).collect(), host)
}

fn train(run: &mut Trainer, corpus: &Corpus, to: u64) -> Vec<u64> {
    (run.step..to)
        .map(|_| run.train_step(corpus).unwrap().loss.to_bits())
        .collect()
}

#[test]
fn the_config_seam_squeezes_the_model_memory_to_one_row_and_keeps_the_slots() {
    let cfg = ram_config(4096);
    assert_eq!((cfg.engram_rows, cfg.engram_slots), (1, 4096));
    let snapshot = DormouseConfig::from_toml(&cfg.to_toml()).unwrap();
    assert_eq!(snapshot, cfg, "the snapshot records both values");

    let mut no_memory = cfg.clone();
    no_memory.use_engram = false;
    let err = no_memory.validate().unwrap_err();
    assert_eq!(err.field, "engram_ram");

    let run = Trainer::new(&cfg, settings(1), &Device::Cpu).unwrap();
    let err = run.model.forward(&[b"abc"], None).unwrap_err().to_string();
    assert!(
        err.contains(".ngram") && err.contains("--engram-ram"),
        "{err}"
    );
}

#[test]
fn only_the_rows_a_batch_read_change_and_the_memory_learns() {
    let cfg = ram_config(1 << 12);
    let corpus = corpus();
    let mut run = Trainer::new(&cfg, settings(30), &Device::Cpu).unwrap();
    let before = run.host.as_ref().unwrap().table(0).to_vec();
    let host_bpb = |run: &Trainer| {
        dormouse::train::bits_per_byte(&run.model, run.host.as_ref(), corpus.held_out(), 24)
            .unwrap()
    };
    let start = host_bpb(&run);
    train(&mut run, &corpus, 1);
    let after = run.host.as_ref().unwrap().table(0);
    let changed = before.iter().zip(after).filter(|(a, b)| a != b).count();
    // One batch of 2 x 24 positions reads at most 48 bigram rows of 16 floats.
    assert!(
        changed > 0 && changed <= 48 * 16,
        "{changed} floats changed"
    );
    train(&mut run, &corpus, 30);
    assert!(
        host_bpb(&run) < start - 1.0,
        "{start} -> {}",
        host_bpb(&run)
    );
}

#[test]
fn resuming_an_engram_ram_run_is_the_same_run_sidecar_included() {
    let cfg = ram_config(1 << 12);
    let corpus = corpus();
    let device = Device::Cpu;
    let mut straight = Trainer::new(&cfg, settings(40), &device).unwrap();
    let straight_losses = train(&mut straight, &corpus, 40);

    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("latest.bin");
    let mut first = Trainer::new(&cfg, settings(40), &device).unwrap();
    let mut losses = train(&mut first, &corpus, 17);
    first.save(&bin).unwrap();
    drop(first);
    assert!(sidecar::sidecar_path(&bin).exists());
    assert!(
        !sidecar::pending_path(&bin).exists(),
        "nothing left pending"
    );
    let mut resumed = Trainer::resume(&cfg, &bin, &device).unwrap();
    losses.extend(train(&mut resumed, &corpus, 40));
    assert_eq!(losses, straight_losses);
    assert!(
        state(&resumed) == state(&straight),
        "model, moments, EMA and host memory bit for bit"
    );
}

/// Saves the run at `a` steps into `dir`, and at `b` steps into `later`.
fn two_saves(dir: &Path, later: &Path, a: u64, b: u64) -> (Trainer, DormouseConfig) {
    let cfg = ram_config(1 << 10);
    let corpus = corpus();
    let mut run = Trainer::new(&cfg, settings(b), &Device::Cpu).unwrap();
    train(&mut run, &corpus, a);
    run.save(&dir.join("latest.bin")).unwrap();
    train(&mut run, &corpus, b);
    run.save(&later.join("latest.bin")).unwrap();
    (run, cfg)
}

#[test]
fn a_save_killed_between_its_two_renames_rolls_forward_and_one_killed_before_keeps_the_old_pair() {
    let (dir, later) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (run, cfg) = two_saves(dir.path(), later.path(), 4, 9);
    let bin = dir.path().join("latest.bin");
    let new_bin = later.path().join("latest.bin");

    // Killed while writing the pending sidecar: a truncated pending file, the old pair in place.
    let full = fs::read(sidecar::sidecar_path(&new_bin)).unwrap();
    fs::write(sidecar::pending_path(&bin), &full[..full.len() / 2]).unwrap();
    let old = Trainer::resume(&cfg, &bin, &Device::Cpu).unwrap();
    assert_eq!(old.step, 4);

    // Killed after the checkpoint was renamed into place, before the sidecar was.
    fs::copy(&new_bin, &bin).unwrap();
    fs::write(sidecar::pending_path(&bin), &full).unwrap();
    let resumed = Trainer::resume(&cfg, &bin, &Device::Cpu).unwrap();
    assert_eq!(resumed.step, 9);
    assert!(state(&resumed) == state(&run));
    assert!(
        !sidecar::pending_path(&bin).exists(),
        "the save was completed"
    );
    assert_eq!(sidecar::peek(&sidecar::sidecar_path(&bin)).unwrap().step, 9);
}

#[test]
fn a_sidecar_of_another_step_or_damaged_or_missing_is_refused() {
    let (dir, later) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, cfg) = two_saves(dir.path(), later.path(), 3, 6);
    let bin = dir.path().join("latest.bin");
    let sidecar = sidecar::sidecar_path(&bin);
    let resume_err = || match Trainer::resume(&cfg, &bin, &Device::Cpu) {
        Err(RunError::Sidecar(e)) => e,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("resumed with a bad sidecar"),
    };

    fs::copy(
        sidecar::sidecar_path(&later.path().join("latest.bin")),
        &sidecar,
    )
    .unwrap();
    assert!(matches!(
        resume_err(),
        SidecarError::WrongStep {
            found: 6,
            expected: 3,
            ..
        }
    ));

    let (_, _) = two_saves(dir.path(), later.path(), 3, 6);
    let mut bytes = fs::read(&sidecar).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    fs::write(&sidecar, &bytes).unwrap();
    assert!(matches!(resume_err(), SidecarError::Checksum { .. }));

    bytes[last] ^= 0x40;
    bytes[20] ^= 1; // slots
    fs::write(&sidecar, &bytes).unwrap();
    assert!(matches!(resume_err(), SidecarError::BadHeader { .. }));

    fs::write(&sidecar, b"DMTRAIN\0 not a sidecar at all").unwrap();
    let err = resume_err();
    assert!(matches!(err, SidecarError::NotASidecar { .. }));
    assert!(err.to_string().contains("TRAINING CHECKPOINT"), "{err}");

    fs::remove_file(&sidecar).unwrap();
    assert!(matches!(resume_err(), SidecarError::Io { .. }));
}

#[test]
fn a_sidecar_of_another_shape_is_refused_naming_the_field() {
    let (dir, later) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, _) = two_saves(dir.path(), later.path(), 2, 3);
    let bin = dir.path().join("latest.bin");
    let shape = MemoryShape {
        orders: vec![2, 3],
        slots: 999,
        dim: 16,
    };
    let stamp = SidecarStamp { step: 2, crc: 0 };
    let err = sidecar::open_for(&bin, &shape, stamp).unwrap_err();
    assert!(
        matches!(
            err,
            SidecarError::Shape {
                field: "engram_slots",
                ..
            }
        ),
        "{err}"
    );
}
