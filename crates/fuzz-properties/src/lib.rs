//! The property each fuzz target checks, on any bytes: a parser returns a value or a typed
//! refusal and never panics, and what it accepts obeys the format's rules. `fuzz/` runs these
//! under libFuzzer (coverage-guided, `fuzz/run_all.sh`); `tests/mutations.rs` runs them on a
//! stable toolchain in `cargo test`, over the kept seeds and a time-bounded stream of their
//! mutations.
//!
//! Each function panics when its property fails: that is the finding.

use dormouse::engram::MAX_ORDERS;
use dormouse::engram::sidecar::{HEADER_LEN, parse_header};
use minirun_format::artifact::k3_published::K3LayerManifest;
use minirun_format::artifact::v4_published::{V4File, V4UnitManifest};
use minirun_format::artifact::{is_member_file_name, parse_manifest};
use minirun_format::identity::{
    is_canonical_repo_id, is_canonical_root_file_name, is_pinned_revision,
};
use minirun_format::index::{ArtifactIndex, IndexShape};
use minirun_format::tile::TileContainer;
use minirun_format::tree::{TreeBuilder, check_repo_path};
use minirun_kernels::{BlockScale, FloatType, Format, QMatrix};
use minirun_runtime::models::deepseek_v3::DeepSeekV3Config;
use minirun_runtime::models::deepseek_v4::config::DeepSeekV4Config;
use minirun_runtime::models::gpt_oss::config::GptOssConfig;
use minirun_runtime::models::kimi_k3::config::KimiK3Config;
use minirun_runtime::models::llama::LlamaConfig;
use minirun_runtime::models::qwen3;
use minirun_runtime::models::qwen3_moe::config::Qwen3MoeConfig;
use minirun_sign::Statement;
use minirun_text::tiktoken::KimiText;
use std::collections::BTreeSet;
use std::path::Path;

/// A property over any bytes: it returns when it holds and panics when it does not.
pub type Property = fn(&[u8]);

/// Every target, by the name its `fuzz/fuzz_targets/NAME.rs` and `fuzz/seeds/NAME/` use.
pub const TARGETS: &[(&str, Property)] = &[
    ("allowed_signers", allowed_signers),
    ("deepseek_config", deepseek_config),
    ("deepseek_v4_config", deepseek_v4_config),
    ("dense_config", dense_config),
    ("dmexp_decode", dmexp_decode),
    ("gpt_oss_config", gpt_oss_config),
    ("hf_tree_page", hf_tree_page),
    ("identity", identity),
    ("index_json", index_json),
    ("k3_layer_manifest", k3_layer_manifest),
    ("kernel_matrix", kernel_matrix),
    ("kimi_k3_config", kimi_k3_config),
    ("kimi_tiktoken", kimi_tiktoken),
    ("ngram_header", ngram_header),
    ("qwen3_moe_config", qwen3_moe_config),
    ("signed_statement", signed_statement),
    ("tile_header", tile_header),
    ("unit_manifest", unit_manifest),
    ("v4_unit_manifest", v4_unit_manifest),
];

/// Any bytes as a DeepSeek-V3 `config.json`: parsing returns a config or a refusal, never panics,
/// and an accepted config is one the model can be built from (groups divide experts, and so on).
pub fn deepseek_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = DeepSeekV3Config::parse(text) {
        assert!(c.n_routed_experts % c.n_group == 0);
        assert!(c.topk_group <= c.n_group);
        assert!(c.num_experts_per_tok <= c.topk_group * (c.n_routed_experts / c.n_group));
        assert!(c.qk_rope_head_dim % 2 == 0);
    }
}

/// Any bytes as a DeepSeek V4 `config.json`: parsing returns a config or a refusal, never
/// panics, and an accepted config is one the model can be built from.
pub fn deepseek_v4_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = DeepSeekV4Config::parse(text) {
        assert_eq!(c.attention.len(), c.num_hidden_layers);
        assert!(c.num_experts_per_tok <= c.n_routed_experts);
        assert!(c.qk_rope_head_dim <= c.head_dim && c.qk_rope_head_dim <= c.index_head_dim);
        assert!(c.num_attention_heads % c.o_groups == 0);
        assert!(c.hash_layers <= c.num_hidden_layers);
        let _ = c.cache_bytes(usize::MAX);
    }
}

/// Any bytes handed to the decoder: it must return Ok or a typed error, never panic,
/// never allocate from an unchecked length.
pub fn dmexp_decode(data: &[u8]) {
    let _ = dmexp::identify(data);
    if let Ok(view) = dmexp::view(data) {
        for entry in &view.header.tensors {
            let mut out = vec![0.0f32; entry.num_values as usize];
            let _ = view.widen_into(&entry.name, &mut out);
        }
    }
    let _ = dmexp::decode(data);
}

/// Any bytes as a Hugging Face tree page (the network hands them to us): the page parser must
/// never panic, and every file it accepts has a safe path and a digest of its algorithm's size.
pub fn hf_tree_page(data: &[u8]) {
    let mut builder = TreeBuilder::default();
    if builder.add_page(data).is_ok() {
        let tree = builder.finish("o/r", "0123456789abcdef0123456789abcdef01234567");
        for (path, file) in &tree.files {
            assert!(check_repo_path(path).is_ok());
            assert_eq!(path, &file.path);
            let expected = if file.digest.algorithm() == "sha256" {
                32
            } else {
                20
            };
            assert_eq!(file.digest.bytes().len(), expected);
        }
    }
}

/// Any bytes as the value of an index's `tokenizer` and `configuration` keys: the identity
/// parsers must never panic, and an identity they accept must obey every field rule.
pub fn identity(data: &[u8]) {
    // Splicing the input in as both values reaches the identity parsers through the public
    // reader without giving this crate its own JSON dependency.
    let mut document = b"{\"tokenizer\":".to_vec();
    document.extend_from_slice(data);
    document.extend_from_slice(b",\"configuration\":");
    document.extend_from_slice(data);
    document.push(b'}');
    let index = ArtifactIndex::parse(&document);
    if let Some(Ok(tokenizer)) = &index.tokenizer {
        assert!(is_canonical_root_file_name(&tokenizer.file));
        assert!(is_canonical_root_file_name(&tokenizer.license));
        assert!(tokenizer.bytes > 0);
        assert!(is_canonical_repo_id(&tokenizer.source_repo));
        assert!(is_pinned_revision(&tokenizer.source_revision));
        assert!(
            tokenizer.sha256.len() == 64
                && !tokenizer.sha256.bytes().any(|b| b.is_ascii_uppercase())
        );
    }
    if let Some(Ok(configuration)) = &index.configuration {
        assert!(is_canonical_root_file_name(&configuration.file));
        assert!(configuration.bytes > 0);
        assert!(is_canonical_repo_id(&configuration.source_repo));
        assert!(is_pinned_revision(&configuration.source_revision));
    }
}

/// Any bytes as an `index.json`: the reader must always return an index (never panic), and
/// what it returns must describe itself without panicking either.
pub fn index_json(data: &[u8]) {
    let index = ArtifactIndex::parse(data);
    let _ = index.describe();
    // A claim is one pair: files and bytes are stated together or not at all.
    assert_eq!(index.files.is_some(), index.bytes.is_some());
    if index.parse_problem.is_some() {
        assert_eq!(index.shape, IndexShape::Unrecognized);
    }
}

/// Any bytes as a published Kimi K3 `layerNN/manifest.json`: parsing returns a manifest or a
/// refusal, never panics, and an accepted manifest's tensors cover their rows band by band
/// inside the blob.
pub fn k3_layer_manifest(data: &[u8]) {
    if let Ok(m) = K3LayerManifest::parse(data, "layer01/manifest.json", 1) {
        let tensors = m
            .tensors("layer01/manifest.json")
            .expect("checked at parse");
        for t in tensors.values() {
            assert!(t.rows > 0 && t.cols > 0 && !t.bands.is_empty());
            for &(offset, len) in &t.bands {
                assert!(offset + len <= m.nonexpert.bytes);
            }
        }
    }
}

/// Any shape, format and byte slices offered to the kernels: `QMatrix::new` accepts only
/// consistent ones, and every accepted matrix multiplies without panicking (NaN codes included).
pub fn kernel_matrix(data: &[u8]) {
    if data.len() < 6 {
        return;
    }
    let (head, bytes) = data.split_at(6);
    let float = [FloatType::F32, FloatType::F16, FloatType::BF16][usize::from(head[0] % 3)];
    let format = match head[0] % 5 {
        0 => Format::Dense(float),
        1 => Format::Affine {
            bits: u32::from(head[1] % 9),
            group: 16 << (head[1] % 4),
            scale: float,
        },
        2 => Format::Mxfp4,
        3 => Format::Fp8Block {
            block_rows: usize::from(head[1] % 5),
            block_cols: 8 * usize::from(head[2] % 4),
            scale: BlockScale::E8m0,
        },
        _ => Format::Fp8Block {
            block_rows: 1 + usize::from(head[1] % 3),
            block_cols: 8,
            scale: BlockScale::Float(float),
        },
    };
    let rows = usize::from(head[3] % 8);
    let cols = 8 * usize::from(head[4] % 40);
    let split = usize::from(head[5]).min(bytes.len());
    let (packed, rest) = bytes.split_at(split);
    let half = rest.len() / 2;
    let (scales, biases) = rest.split_at(half);
    if let Ok(m) = QMatrix::new(format, rows, cols, packed, scales, biases) {
        let x = vec![0.5f32; cols];
        let mut y = vec![0f32; rows];
        m.matvec(&x, &mut y)
            .expect("a consistent matrix multiplies");
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            m.dequantize_row(r, &mut row)
                .expect("every row dequantizes");
        }
    }
}

/// Any bytes as a Kimi K3 `config.json`: parsing returns a config or a refusal, never panics,
/// and an accepted config is one the model can be built from.
pub fn kimi_k3_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = KimiK3Config::parse(text) {
        assert!(c.num_experts % c.num_expert_group == 0);
        assert!(c.topk_group <= c.num_expert_group);
        assert!(c.num_experts_per_token <= c.num_experts);
        assert!(c.kda.short_conv_kernel_size >= 1 && c.kda.head_dim >= 1);
        assert!(c.kda.layers.windows(2).all(|w| w[0] < w[1]));
        assert!(c.kda.layers.iter().all(|&l| l < c.num_hidden_layers));
    }
}

/// Any bytes as Kimi K3's `tiktoken.model`: parsing returns a vocabulary or a refusal, never
/// panics, and an accepted vocabulary encodes text and decodes it back.
pub fn kimi_tiktoken(data: &[u8]) {
    if let Ok(text) = KimiText::parse(data) {
        let sample = "The clockmaker's 12 clocks, 钟表匠\n  done. ";
        let ids = text.encode(sample).expect("every byte is a token");
        assert_eq!(text.decode(&ids).unwrap(), sample);
    }
}

/// Any bytes as the start of a `.ngram` sidecar: the header parser must never panic, and a
/// header it accepts must obey the documented rules.
pub fn ngram_header(data: &[u8]) {
    if let Ok(header) = parse_header(data, Path::new("fuzz.ngram")) {
        assert!(data.len() >= HEADER_LEN);
        assert!((1..=MAX_ORDERS).contains(&header.shape.orders.len()));
    }
}

/// Any bytes as a Qwen3-MoE `config.json`: parsing returns a config or a refusal, never panics,
/// and an accepted config is one the model can be built from.
pub fn qwen3_moe_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = Qwen3MoeConfig::parse(text) {
        assert!(c.num_attention_heads % c.num_key_value_heads == 0);
        assert!(c.head_dim % 2 == 0);
        assert!(c.num_experts_per_tok <= c.num_experts);
        assert!(c.mlp_only_layers.iter().all(|&l| l < c.num_hidden_layers));
    }
}

/// Any bytes as a Llama or dense Qwen3 `config.json`: parsing returns a config or a refusal,
/// never panics, and an accepted config is one the model can be built from.
pub fn dense_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = [LlamaConfig::parse(text), qwen3::config::parse(text)];
    for c in parsed.into_iter().flatten() {
        assert!(c.num_attention_heads % c.num_key_value_heads == 0);
        assert!(c.head_dim > 0 && c.head_dim % 2 == 0);
        if let Some(rule) = &c.rope_scaling {
            assert!(rule.factor > 0.0 && rule.high_freq_factor > rule.low_freq_factor);
        }
    }
}

/// Any bytes as a gpt-oss `config.json`: parsing returns a config or a refusal, never panics,
/// and an accepted config is one the model can be built from.
pub fn gpt_oss_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = GptOssConfig::parse(text) {
        assert!(c.num_attention_heads % c.num_key_value_heads == 0);
        assert!(c.head_dim % 2 == 0);
        assert!(c.num_experts_per_tok <= c.num_local_experts);
        assert_eq!(c.layer_types.len(), c.num_hidden_layers);
        assert!(c.sliding_window > 0 && c.swiglu_limit > 0.0);
    }
}

/// Any bytes as a tile container header, with any claimed file length: the reader must
/// return a container or a typed error, and tile addressing must stay in range.
pub fn tile_header(data: &[u8]) {
    // The first 8 bytes (little-endian, zero-padded) are the claimed file length.
    let (head, header) = data.split_at(data.len().min(8));
    let mut len = [0u8; 8];
    len[..head.len()].copy_from_slice(head);
    let file_len = u64::from_le_bytes(len);
    if let Ok(container) = TileContainer::parse(header, file_len) {
        let last = u64::from(container.geometry.tile_count) - 1;
        for index in [0, last, last + 1] {
            if let Ok(range) = container.tile_range(index) {
                assert!(range.end <= container.layout.total_bytes);
            }
            let _ = container.bias_range(index);
            let _ = container.verify_tile(index, &[]);
        }
    }
}

/// Any bytes as a unit's manifest.json (an artifact folder is untrusted input): the parser must
/// never panic, and every manifest it accepts names its unit and lists distinct plain file names.
pub fn unit_manifest(data: &[u8]) {
    if let Ok(manifest) = parse_manifest("layer00", data) {
        assert_eq!(manifest.unit, "layer00");
        let mut names = BTreeSet::new();
        for file in &manifest.files {
            assert!(is_member_file_name(file.name()));
            assert!(names.insert(file.name()));
        }
    }
}

/// Any bytes as a published DeepSeek V4 unit manifest: parsing returns a manifest or a refusal,
/// never panics, and an accepted manifest obeys the layout's rules.
pub fn v4_unit_manifest(data: &[u8]) {
    for unit in ["layers02", "global00", "mtp00"] {
        let Ok(m) = V4UnitManifest::parse(data, unit) else {
            continue;
        };
        assert_eq!(m.unit, unit);
        let _ = m.total_bytes();
        for f in &m.files {
            if let V4File::Blob { bytes, tensors, .. } = f {
                let mut at = 0;
                for t in tensors {
                    assert_eq!(t.offset, at);
                    at += t.bytes;
                }
                assert_eq!(at, *bytes);
            }
        }
        if let Some(order) = &m.expert_order {
            let mut seen = order.clone();
            seen.sort_unstable();
            assert!(seen.iter().enumerate().all(|(i, &e)| i as u32 == e));
        }
    }
}

/// Any bytes as a signed artifact's `minirun-statement.txt`: parsing returns a statement or a
/// refusal, never panics, and an accepted statement is in canonical form (writing it again
/// gives the same bytes) with only safe paths in increasing order.
pub fn signed_statement(data: &[u8]) {
    if let Ok(statement) = Statement::parse(data) {
        assert_eq!(statement.to_bytes(), data);
        for path in statement.files.keys() {
            assert!(check_repo_path(path).is_ok(), "{path:?}");
        }
        if let Some(id) = &statement.identity {
            assert!(is_canonical_repo_id(&id.repo) && is_pinned_revision(&id.revision));
        }
    }
}

/// Any bytes as an allowed-signers file: parsing returns its lines or a refusal naming a line,
/// never panics, and every accepted line has a key and principals.
pub fn allowed_signers(data: &[u8]) {
    if let Ok(signers) = minirun_sign::allowed_signers::parse(data) {
        for signer in signers {
            assert!(!signer.principals.is_empty());
            assert!(signer.line >= 1);
        }
    }
}
