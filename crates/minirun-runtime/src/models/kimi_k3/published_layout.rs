//! Opening an artifact in the published Kimi K3 layout (`docs/formats/k3-published.md`): the
//! layer manifests' row bands and the banded expert containers become tensors under the
//! checkpoint's own names, read as banded parts; `global/`'s files become blob members.

use std::ops::Range;
use std::sync::OnceLock;

use minirun_format::artifact::k3_published::{
    BandDtype, EXPERT_PROJECTIONS, K3Experts, K3LayerManifest, check_globals,
};
use minirun_format::artifact::{Layout, Member, SourceRef};
use minirun_format::tile::{HEADER_BYTES, QuantMode, RawHeader, TileContainer};

use minirun_kernels::{FloatType, Format};

use super::config::KimiK3Config;
use minirun_stream::artifact::{
    Artifact, ArtifactError, Location, PartLayout, PublishedReader, invalid,
};

fn member(
    name: &str,
    dtype: &str,
    shape: Vec<usize>,
    file: &str,
    offset: u64,
    bytes: u64,
) -> Member {
    Member {
        source: SourceRef {
            source_tensor: name.to_string(),
            dtype: dtype.to_string(),
            shape,
            shard: file.to_string(),
            shard_offset: offset,
            bytes,
        },
        offset,
        quantization: None,
        not_tiled: None,
    }
}

/// How the registry opens an artifact in this layout.
pub static READER: PublishedReader = PublishedReader {
    layout: Layout::K3Published,
    register: add_k3_published,
};

/// Registers every tensor of the published layout. The configuration is read first: the
/// globals are checked against its sizes and the expert containers against its expert
/// count and widths.
fn add_k3_published(artifact: &mut Artifact) -> Result<(), ArtifactError> {
    let c = KimiK3Config::parse(&artifact.config_json)
        .map_err(|e| invalid("config.json", e.to_string()))?;
    let first = artifact
        .metadata("layer00/manifest.json")?
        .unwrap_or_default();
    let layer0 = K3LayerManifest::parse(&first, "layer00/manifest.json", 0)
        .map_err(|e| invalid("layer00/manifest.json", e.to_string()))?;
    let root = match layer0.nonexpert.units.first() {
        Some(u) if u.tensor.starts_with("language_model.") => "language_model.",
        _ => "",
    };
    add_k3_globals(artifact, &c, root)?;
    for layer in 0..c.num_hidden_layers {
        add_k3_layer(artifact, &c, root, layer)?;
    }
    Ok(())
}

fn add_k3_globals(
    artifact: &mut Artifact,
    c: &KimiK3Config,
    root: &str,
) -> Result<(), ArtifactError> {
    let (vocab, hidden) = (c.vocab_size as u64, c.hidden_size as u64);
    let mut files = Vec::new();
    for name in [
        "global/embed_tokens.bin",
        "global/lm_head.bin",
        "global/final.bin",
    ] {
        files.push(artifact.add_unlisted_file(name)?);
    }
    let len = |f: usize| artifact.file_bytes(f);
    let offsets = check_globals(vocab, hidden, len(files[0]), len(files[1]), len(files[2]))
        .map_err(|e| invalid("global", e.to_string()))?;
    let dense = vec![vocab as usize, hidden as usize];
    artifact.add_member(
        files[0],
        member(
            &format!("{root}model.embed_tokens.weight"),
            "BF16",
            dense.clone(),
            "global/embed_tokens.bin",
            0,
            vocab * hidden * 2,
        ),
    )?;
    artifact.add_member(
        files[1],
        member(
            &format!("{root}lm_head.weight"),
            "BF16",
            dense,
            "global/lm_head.bin",
            0,
            vocab * hidden * 2,
        ),
    )?;
    let names = [
        format!("{root}model.norm.weight"),
        format!("{root}model.output_attn_res.norm_weight"),
        format!("{root}model.output_attn_res.proj_weight"),
    ];
    for (name, offset) in names.iter().zip(offsets) {
        let m = member(
            name,
            "BF16",
            vec![hidden as usize],
            "global/final.bin",
            offset,
            hidden * 2,
        );
        artifact.add_member(files[2], m)?;
    }
    Ok(())
}

fn add_k3_layer(
    artifact: &mut Artifact,
    c: &KimiK3Config,
    root: &str,
    layer: usize,
) -> Result<(), ArtifactError> {
    let unit = format!("layer{layer:02}");
    let manifest_path = format!("{unit}/manifest.json");
    let bytes = artifact.metadata(&manifest_path)?.ok_or_else(|| {
        invalid(
            &manifest_path,
            "is missing: the published layout has one per layer",
        )
    })?;
    let manifest = K3LayerManifest::parse(&bytes, &manifest_path, layer)
        .map_err(|e| invalid(&manifest_path, e.to_string()))?;
    let tensors = manifest
        .tensors(&manifest_path)
        .map_err(|e| invalid(&manifest_path, e.to_string()))?;
    let blob = format!("{unit}/{}", manifest.nonexpert.file);
    let file = artifact.add_listed_file(&blob, manifest.nonexpert.bytes);
    for t in tensors.values() {
        let (float, dtype) = match t.dtype {
            BandDtype::F32 => (FloatType::F32, "F32"),
            BandDtype::Bf16 => (FloatType::BF16, "BF16"),
        };
        // Bands are in row order; their offsets need not ascend (the table says where each
        // is), so the read covers the span of all of them.
        let start = t.bands.iter().map(|b| b.0).min().unwrap_or(0);
        let end = t.bands.iter().map(|b| b.0 + b.1).max().unwrap_or(0);
        let shape = vec![t.rows as usize, t.cols as usize];
        let location = Location::Banded {
            format: Format::Dense(float),
            rows: t.rows as usize,
            cols: t.cols as usize,
            member: Some(Box::new(member(
                &t.name,
                dtype,
                shape,
                &blob,
                start,
                t.bytes(),
            ))),
            part: PartLayout::Bands {
                file,
                range: start..end,
                packed: t
                    .bands
                    .iter()
                    .map(|&(o, len)| o - start..o - start + len)
                    .collect(),
                scales: Vec::new(),
            },
            resident: OnceLock::new(),
        };
        artifact.insert(&blob, &t.name, location)?;
    }
    if c.is_moe(layer) {
        add_k3_experts(
            artifact,
            c,
            &format!("{root}model.layers.{layer}"),
            &unit,
            layer,
        )?;
    }
    Ok(())
}

/// The three expert containers of an MoE layer, each expert's projection a banded part of
/// its consecutive tiles.
fn add_k3_experts(
    artifact: &mut Artifact,
    c: &KimiK3Config,
    lp: &str,
    unit: &str,
    layer: usize,
) -> Result<(), ArtifactError> {
    let mut opened = Vec::new();
    for projection in EXPERT_PROJECTIONS {
        let path = format!("{unit}/{unit}-{projection}.mxfp4tile");
        let file = artifact.add_unlisted_file(&path)?;
        let len = artifact.file_bytes(file);
        if len < HEADER_BYTES {
            return Err(invalid(&path, "is shorter than a header"));
        }
        let header = artifact.read_vec(file, 0, HEADER_BYTES)?;
        let container =
            TileContainer::parse(&header, len).map_err(|e| invalid(&path, e.to_string()))?;
        if container.geometry.mode != QuantMode::Mxfp4 || container.layout.total_bytes != len {
            return Err(invalid(
                &path,
                "is not an MXFP4 container of its own length",
            ));
        }
        opened.push((file, path, RawHeader::read(&header), container));
    }
    let experts = K3Experts::from_headers(layer, &opened[0].2, &opened[1].2, &opened[2].2)
        .map_err(|e| invalid(&opened[0].1, e.to_string()))?;
    if (experts.experts, experts.latent, experts.intermediate)
        != (
            c.num_experts,
            c.routed_expert_hidden_size,
            c.moe_intermediate_size,
        )
    {
        return Err(invalid(
            &opened[0].1,
            format!(
                "its containers hold {} experts of {} x {}; config.json says {} of {} x {}",
                experts.experts,
                experts.intermediate,
                experts.latent,
                c.num_experts,
                c.moe_intermediate_size,
                c.routed_expert_hidden_size
            ),
        ));
    }
    for (k, (file, path, _, container)) in opened.into_iter().enumerate() {
        let projection = EXPERT_PROJECTIONS[k];
        let l = container.layout;
        let (rows, cols) = match projection {
            "w2" => (experts.latent, experts.intermediate),
            _ => (experts.intermediate, experts.latent),
        };
        artifact.set_container(file, container);
        for e in 0..experts.experts {
            let range = experts
                .byte_range(projection, e, l.tile_stride)
                .ok_or_else(|| invalid(&path, format!("has no expert {e}")))?;
            let bands = experts.tiles(projection, e).map_or(0, |t| t.end - t.start);
            let band = |b: u64, at: u64, len: u64| -> Range<u64> {
                b * l.tile_stride + at..b * l.tile_stride + at + len
            };
            let location = Location::Banded {
                format: Format::Mxfp4,
                rows,
                cols,
                member: None,
                part: PartLayout::Bands {
                    file,
                    range,
                    packed: (0..bands).map(|b| band(b, 0, l.packed_bytes)).collect(),
                    scales: (0..bands)
                        .map(|b| band(b, l.scale_offset, l.scale_bytes))
                        .collect(),
                },
                resident: OnceLock::new(),
            };
            let name = format!("{lp}.block_sparse_moe.experts.{e}.{projection}.weight");
            artifact.insert(&path, &name, location)?;
        }
    }
    Ok(())
}
