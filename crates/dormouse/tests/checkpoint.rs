//! The training checkpoint container: sections round-trip, each is read and CRC-checked on its
//! own (a damaged optimizer section does not stop the model section from being read), and
//! every damaged table is refused without a panic.

use std::fs;
use std::path::Path;

use dormouse::checkpoint::{self, Checkpoint, CheckpointError, SectionKind};
use proptest::prelude::*;

fn sample(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("latest.bin");
    let sections: [(SectionKind, &[u8]); 4] = [
        (SectionKind::Model, b"model tensors"),
        (
            SectionKind::Optimizer,
            b"adam moments, much larger in real life",
        ),
        (SectionKind::Ema, b"teacher"),
        (SectionKind::Trainer, b"step = 7\n"),
    ];
    checkpoint::write(&path, &sections).unwrap();
    path
}

#[test]
fn sections_round_trip_and_are_aligned() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.read(SectionKind::Trainer).unwrap(), b"step = 7\n");
    assert_eq!(ckpt.read(SectionKind::Model).unwrap(), b"model tensors");
    assert!(ckpt.entries().iter().all(|e| e.offset % 8 == 0));
    assert_eq!(fs::read(&path).unwrap()[..8], *b"DMTRAIN\0");
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file left"
    );
}

#[test]
fn a_damaged_optimizer_section_does_not_stop_reading_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = sample(dir.path());
    let optim = Checkpoint::open(&path)
        .unwrap()
        .entries()
        .iter()
        .find(|e| e.kind == SectionKind::Optimizer)
        .copied()
        .unwrap();
    let mut bytes = fs::read(&path).unwrap();
    bytes[optim.offset as usize + 3] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.read(SectionKind::Model).unwrap(), b"model tensors");
    assert!(matches!(
        ckpt.read(SectionKind::Optimizer),
        Err(CheckpointError::Checksum {
            kind: SectionKind::Optimizer,
            ..
        })
    ));
}

#[test]
fn damaged_files_are_refused_with_their_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let good = fs::read(sample(dir.path())).unwrap();
    let path = dir.path().join("bad.bin");
    let refuse = |bytes: &[u8]| {
        fs::write(&path, bytes).unwrap();
        Checkpoint::open(&path).unwrap_err()
    };
    assert!(
        matches!(
            refuse(&good[..good.len() - 1]),
            CheckpointError::BadTable { .. }
        ),
        "truncated"
    );
    assert!(
        matches!(
            refuse(&[&good[..], b"x"].concat()),
            CheckpointError::BadTable { .. }
        ),
        "padded"
    );
    let mut v2 = good.clone();
    v2[8] = 2;
    assert!(matches!(
        refuse(&v2),
        CheckpointError::UnknownVersion { found: 2, .. }
    ));
    let mut many = good.clone();
    many[12] = 9;
    assert!(matches!(refuse(&many), CheckpointError::BadTable { .. }));
    let mut unknown = good.clone();
    unknown[16..24].copy_from_slice(b"weights\0");
    assert!(
        refuse(&unknown)
            .to_string()
            .contains("unknown section kind")
    );
    let mut twice = good.clone();
    twice[48..56].copy_from_slice(b"model\0\0\0");
    assert!(refuse(&twice).to_string().contains("twice"));
    let export = fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dmexp/tests/data/golden.bf16.dmexp"),
    )
    .unwrap();
    let err = refuse(&export);
    assert!(
        matches!(&err, CheckpointError::NotACheckpoint { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(".dmexp export"), "{err}");
}

#[test]
fn a_write_into_a_missing_directory_fails_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let err = checkpoint::write(
        &dir.path().join("nope/latest.bin"),
        &[(SectionKind::Model, b"x")],
    )
    .unwrap_err();
    assert!(matches!(err, CheckpointError::Io { .. }));
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

proptest! {
    #[test]
    fn arbitrary_bytes_after_the_magic_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..400)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.bin");
        fs::write(&path, [&b"DMTRAIN\0"[..], &tail].concat()).unwrap();
        if let Ok(ckpt) = Checkpoint::open(&path) {
            for kind in SectionKind::ALL {
                let _ = ckpt.read(kind);
            }
        }
    }
}

mod weights {
    use candle_core::{DType, Device};
    use candle_nn::{VarBuilder, VarMap};
    use dormouse::checkpoint::{self, Checkpoint, SectionKind};
    use dormouse::weights::{WeightsError, load_into_varmap, save_varmap};
    use dormouse::{Dormouse, DormouseConfig};

    fn model(cfg: &DormouseConfig) -> (VarMap, Dormouse) {
        let varmap = VarMap::new();
        let model = Dormouse::new(
            cfg,
            VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        )
        .unwrap();
        (varmap, model)
    }

    /// A model written into a checkpoint's model section and loaded into a freshly (and
    /// differently) initialised model computes bit-identical logits.
    #[test]
    fn the_model_section_restores_the_model_bit_for_bit() {
        let cfg = DormouseConfig::preset("nano").unwrap();
        let (saved_vars, saved) = model(&cfg);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("latest.bin");
        let bytes = save_varmap(&saved_vars).unwrap();
        checkpoint::write(
            &path,
            &[
                (SectionKind::Model, &bytes),
                (SectionKind::Trainer, b"step = 0\n"),
            ],
        )
        .unwrap();

        let (fresh_vars, fresh) = model(&cfg);
        let text = b"once upon a time";
        let before = fresh
            .forward(&[text], None)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let section = Checkpoint::open(&path)
            .unwrap()
            .read(SectionKind::Model)
            .unwrap();
        load_into_varmap(&fresh_vars, &section, &Device::Cpu).unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let expected = bits(
            saved
                .forward(&[text], None)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
        );
        let restored = bits(
            fresh
                .forward(&[text], None)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
        );
        assert_ne!(bits(before), expected, "the fresh model started different");
        assert_eq!(restored, expected);
    }

    #[test]
    fn weights_of_another_shape_are_refused_and_change_nothing() {
        let nano = DormouseConfig::preset("nano").unwrap();
        let wider = DormouseConfig {
            d_model: 128,
            ..nano.clone()
        };
        let (wide_vars, _) = model(&wider);
        let (nano_vars, nano_model) = model(&nano);
        let before = nano_model
            .forward(&[b"abc"], None)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let err = load_into_varmap(&nano_vars, &save_varmap(&wide_vars).unwrap(), &Device::Cpu)
            .unwrap_err();
        assert!(matches!(err, WeightsError::Shape { .. }), "{err}");
        let after = nano_model
            .forward(&[b"abc"], None)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(before, after, "a refused load changes no weight");

        let untied = DormouseConfig {
            tie_embeddings: false,
            ..nano.clone()
        };
        let (untied_vars, _) = model(&untied);
        let err = load_into_varmap(
            &nano_vars,
            &save_varmap(&untied_vars).unwrap(),
            &Device::Cpu,
        )
        .unwrap_err();
        assert!(
            matches!(&err, WeightsError::Unexpected { name } if name == "lm_head.weight"),
            "{err}"
        );
        let err = load_into_varmap(
            &untied_vars,
            &save_varmap(&nano_vars).unwrap(),
            &Device::Cpu,
        )
        .unwrap_err();
        assert!(
            matches!(&err, WeightsError::Missing { name } if name == "lm_head.weight"),
            "{err}"
        );
    }
}
