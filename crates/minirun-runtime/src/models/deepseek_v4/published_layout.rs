//! Opening an artifact in the published DeepSeek V4 layout (`docs/formats/v4-published.md`):
//! `index.json` names the units; each layer's FP8 containers become matrices under their
//! `source_tensor`, its expert containers one matrix per expert (tile `i` is expert
//! `expert_order[i]`), its plain blobs' members tensors; `global00` likewise. The
//! multi-token-prediction units are checked against the index and not opened for the run.

use minirun_format::artifact::v4_published::{
    ContainerEntry, EXPERT_PROJECTIONS, UnitKind, V4File, V4UnitManifest,
};
use minirun_format::artifact::{Layout, Member, SourceRef};
use minirun_format::index::ArtifactIndex;
use minirun_format::tile::{HEADER_BYTES, QuantMode, TileContainer};

use super::config::DeepSeekV4Config;
use minirun_stream::artifact::{Artifact, ArtifactError, Location, PublishedReader, invalid};

/// How the registry opens an artifact in this layout.
pub static READER: PublishedReader = PublishedReader {
    layout: Layout::V4Published,
    register: add_v4_published,
};

/// Registers every tensor the run reads, after checking each unit's manifest against the
/// index and each container's header against its manifest entry.
fn add_v4_published(artifact: &mut Artifact) -> Result<(), ArtifactError> {
    let c = DeepSeekV4Config::parse(&artifact.config_json)
        .map_err(|e| invalid("config.json", e.to_string()))?;
    let bytes = artifact.metadata("index.json")?.ok_or_else(|| {
        invalid(
            "index.json",
            "is missing: the published V4 layout lists its units there",
        )
    })?;
    let index = ArtifactIndex::parse(&bytes);
    let (repo, revision) = match index.sources.as_slice() {
        [s] => (s.repo.clone(), s.revision.clone().unwrap_or_default()),
        _ => return Err(invalid("index.json", "names no single upstream")),
    };
    let mut layers = 0;
    let mut mtp = 0;
    for (i, summary) in index.units.iter().enumerate() {
        let unit = summary.name.clone().unwrap_or_default();
        let kind = UnitKind::of(&unit).ok_or_else(|| {
            invalid(
                "index.json",
                format!("unit {i} ({unit:?}) is not a V4 unit"),
            )
        })?;
        match kind {
            UnitKind::Layer(n) if n == layers => layers += 1,
            UnitKind::Mtp(n) if n == mtp => mtp += 1,
            UnitKind::Global => {}
            _ => {
                return Err(invalid(
                    "index.json",
                    format!(
                        "unit {unit} is out of order (layers and mtp stages are numbered from 00)"
                    ),
                ));
            }
        }
        let path = format!("{unit}/manifest.json");
        let bytes = artifact
            .metadata(&path)?
            .ok_or_else(|| invalid(&path, "is missing: index.json lists the unit"))?;
        let manifest =
            V4UnitManifest::parse(&bytes, &unit).map_err(|e| invalid(&path, e.to_string()))?;
        if (
            manifest.source_repo.as_str(),
            manifest.source_revision.as_str(),
        ) != (repo.as_str(), revision.as_str())
        {
            return Err(invalid(
                &path,
                format!(
                    "names {}@{}, index.json {repo}@{revision}",
                    manifest.source_repo, manifest.source_revision
                ),
            ));
        }
        let total = manifest.total_bytes();
        if (Some(manifest.files.len() as u64), Some(total)) != (summary.files, summary.bytes) {
            return Err(invalid(
                &path,
                format!(
                    "lists {} files of {total} bytes; index.json says {:?} of {:?}",
                    manifest.files.len(),
                    summary.files,
                    summary.bytes
                ),
            ));
        }
        match kind {
            UnitKind::Mtp(_) => {}
            UnitKind::Layer(n) => add_v4_unit(artifact, &manifest, Some((n, &c)))?,
            UnitKind::Global => add_v4_unit(artifact, &manifest, None)?,
        }
    }
    if layers != c.num_hidden_layers {
        return Err(invalid(
            "index.json",
            format!(
                "lists {layers} layer units; config.json has {} layers",
                c.num_hidden_layers
            ),
        ));
    }
    if (mtp > 0) != (c.num_nextn_predict_layers > 0) {
        return Err(invalid(
            "index.json",
            format!(
                "lists {mtp} mtp units; config.json has {} multi-token-prediction layers",
                c.num_nextn_predict_layers
            ),
        ));
    }
    Ok(())
}

fn add_v4_unit(
    artifact: &mut Artifact,
    manifest: &V4UnitManifest,
    layer: Option<(usize, &DeepSeekV4Config)>,
) -> Result<(), ArtifactError> {
    let unit = &manifest.unit;
    for entry in &manifest.files {
        let path = format!("{unit}/{}", entry.name());
        let file = artifact.add_listed_file(&path, entry.bytes());
        match entry {
            V4File::Blob { tensors, .. } => {
                for t in tensors {
                    let shape = t.shape.iter().map(|&d| d as usize).collect();
                    artifact.add_member(
                        file,
                        Member {
                            source: SourceRef {
                                source_tensor: t.name.clone(),
                                dtype: t.dtype.name().to_string(),
                                shape,
                                shard: path.clone(),
                                shard_offset: t.offset,
                                bytes: t.bytes,
                            },
                            offset: t.offset,
                            quantization: None,
                            not_tiled: None,
                        },
                    )?;
                }
            }
            V4File::Container(c) => {
                open_v4_container(artifact, file, &path, c)?;
                match (&c.source_tensor, layer) {
                    (Some(name), _) => {
                        let g = artifact.container(file).map(|c| c.geometry);
                        if g.is_none_or(|g| (g.scale_block_rows, g.group_size) != (128, 128)) {
                            return Err(invalid(&path, "is not an FP8 matrix of 128 x 128 blocks"));
                        }
                        artifact.insert(&path, name, Location::Tiled { file, tile: None })?;
                    }
                    (None, Some((n, config))) => {
                        add_v4_experts(artifact, manifest, file, &path, c, n, config)?;
                    }
                    (None, None) => return Err(invalid(&path, "names no source_tensor")),
                }
            }
        }
    }
    Ok(())
}

/// Reads a container's header and checks it against its manifest entry.
fn open_v4_container(
    artifact: &mut Artifact,
    file: usize,
    path: &str,
    c: &ContainerEntry,
) -> Result<(), ArtifactError> {
    if c.bytes < HEADER_BYTES {
        return Err(invalid(path, "is shorter than a header"));
    }
    let header = artifact.read_vec(file, 0, HEADER_BYTES)?;
    let container =
        TileContainer::parse(&header, c.bytes).map_err(|e| invalid(path, e.to_string()))?;
    let g = &container.geometry;
    let mode = match c.layout.as_str() {
        "mxfp4" => QuantMode::Mxfp4,
        _ => QuantMode::Fp8E4m3Block,
    };
    let stated = (g.mode, g.rows, g.cols, g.tile_count, g.bits, g.group_size);
    let listed = (mode, c.rows, c.cols, c.count, c.element_bits, c.group);
    if stated != listed
        || c.block_rows.is_some_and(|b| b != g.scale_block_rows)
        || container.layout.total_bytes != c.bytes
    {
        return Err(invalid(
            path,
            format!(
                "its header ({:?} {} x {}, {} tiles of {} bits, group {}, {} bytes) is not what its manifest entry says",
                g.mode,
                g.rows,
                g.cols,
                g.tile_count,
                g.bits,
                g.group_size,
                container.layout.total_bytes
            ),
        ));
    }
    artifact.set_container(file, container);
    Ok(())
}

/// Layer `n`'s expert container of one projection: expert e is tile `slot(e)`.
fn add_v4_experts(
    artifact: &mut Artifact,
    manifest: &V4UnitManifest,
    file: usize,
    path: &str,
    c: &ContainerEntry,
    n: usize,
    config: &DeepSeekV4Config,
) -> Result<(), ArtifactError> {
    let unit = &manifest.unit;
    let projection = EXPERT_PROJECTIONS
        .iter()
        .find(|p| c.name == format!("{unit}-{p}.mxfp4tile"))
        .ok_or_else(|| {
            invalid(
                path,
                "is neither a matrix (no source_tensor) nor an expert container",
            )
        })?;
    let (hidden, inner) = (
        config.hidden_size as u32,
        config.moe_intermediate_size as u32,
    );
    let shape = match *projection {
        "w2" => (hidden, inner),
        _ => (inner, hidden),
    };
    let experts = config.n_routed_experts;
    let order_len = manifest.expert_order.as_ref().map_or(0, Vec::len);
    if c.layout != "mxfp4"
        || (c.rows, c.cols) != shape
        || c.count as usize != experts
        || order_len != experts
    {
        return Err(invalid(
            path,
            format!(
                "holds {} {} experts of {} x {} in an order of {order_len}; config.json has {experts} of {} x {}",
                c.count, c.layout, c.rows, c.cols, shape.0, shape.1
            ),
        ));
    }
    for e in 0..experts as u32 {
        let slot = manifest
            .slot_of(e)
            .ok_or_else(|| invalid(path, format!("expert_order has no expert {e}")))?;
        let name = format!("layers.{n}.ffn.experts.{e}.{projection}.weight");
        artifact.insert(
            path,
            &name,
            Location::Tiled {
                file,
                tile: Some(slot as u64),
            },
        )?;
    }
    Ok(())
}
