//! minirun's file formats, with no ML dependency:
//!
//! - [`tile`]: the `MNRNTIL1` quantized tile container (versions 1-3), byte-compatible with the
//!   published artifacts; spec in `docs/formats/tile-container.md`;
//! - [`synthetic`]: the SplitMix64-based deterministic content of synthetic containers;
//! - [`index`]: the three shapes of an artifact's `index.json` (and "unrecognized");
//! - [`identity`]: the fail-closed tokenizer and configuration identity objects;
//! - [`artifact`]: the artifact layout (units, unit manifests, the incomplete-pack marker) and
//!   the `index.json` a pack writes; spec in `docs/formats/artifact.md`;
//! - [`tree`]: a publication's file tree with each file's published digest.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod artifact;
pub mod identity;
pub mod index;
pub mod synthetic;
pub mod tile;
pub mod tree;
