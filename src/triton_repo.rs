//! Triton's model repository layout, read beside Fermata's own.
//!
//! A Triton model is a directory `REPO/MODEL/` holding `config.pbtxt` (a model
//! configuration in protobuf text format) and one directory per version,
//! `REPO/MODEL/1/model.onnx`. The configuration is parsed against Triton's
//! schema (proto/model_config.proto) with prost-reflect's text-format parser,
//! then mapped onto Fermata's [`ModelMeta`] by [`to_meta`]: what Fermata
//! supports is taken, what it does not is refused naming the field, and what has
//! no meaning under deferred batching is accepted and documented
//! (docs/operations.md, "Triton model repositories"). Parsing and mapping are
//! pure; [`load`] reads the directory.

use crate::repo::{DType, ModelMeta, TensorMeta, MAX_SAMPLE_BYTES};
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Triton's model configuration as Rust types (proto/model_config.proto).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/fermata.triton.rs"));
}

/// The configuration file of a Triton model directory.
pub const CONFIG_FILE: &str = "config.pbtxt";
/// The largest `config.pbtxt` read (Triton's are a few kilobytes).
pub const CONFIG_BYTES_MAX: u64 = 1 << 20;
/// The SLO of a model whose configuration gives none (ms).
pub const DEFAULT_SLO_MS: f64 = 100.0;
/// The configuration parameter that sets a model's SLO in milliseconds:
/// `parameters { key: "slo_ms" value: { string_value: "50" } }`.
pub const SLO_PARAMETER: &str = "slo_ms";
/// The model file of a version when `default_model_filename` is not set.
pub const DEFAULT_MODEL_FILE: &str = "model.onnx";
/// The largest dimension a tensor may declare (a sample's size is bounded
/// again as a whole).
const DIM_MAX: i64 = 1 << 31;

/// Whether `dir` is a Triton model directory (it holds `config.pbtxt`).
pub fn is_model_dir(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file()
}

fn descriptor() -> &'static prost_reflect::MessageDescriptor {
    static DESC: OnceLock<prost_reflect::MessageDescriptor> = OnceLock::new();
    DESC.get_or_init(|| {
        let pool = prost_reflect::DescriptorPool::decode(
            &include_bytes!(concat!(env!("OUT_DIR"), "/model_config.fds"))[..],
        )
        .expect("the build's model_config.fds decodes");
        pool.get_message_by_name("fermata.triton.ModelConfig")
            .expect("model_config.proto defines ModelConfig")
    })
}

/// Line and column (both from 1) of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let col = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    (line, col)
}

/// `text` with a `:` inserted between a field name and the `[` of a list of
/// messages (`input [ { ... } ]`), and the offsets (in the result) where one
/// was inserted. The text format makes that colon optional for lists of
/// messages, and every Triton configuration leaves it out, but prost-reflect's
/// parser requires it; nothing else is changed (strings and `#` comments are
/// skipped, and a `[` is only taken for such a list when a `{`, `<` or `]`
/// follows it).
fn colons_before_message_lists(text: &str) -> (String, Vec<usize>) {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let mut inserted = Vec::new();
    let mut i = 0;
    let mut last_start = 0;
    // The next significant byte at or after `j` (whitespace and comments skipped).
    let next_significant = |mut j: usize| -> Option<u8> {
        while j < b.len() {
            match b[j] {
                b' ' | b'\t' | b'\r' | b'\n' => j += 1,
                b'#' => {
                    while j < b.len() && b[j] != b'\n' {
                        j += 1;
                    }
                }
                c => return Some(c),
            }
        }
        None
    };
    while i < b.len() {
        match b[i] {
            q @ (b'"' | b'\'') => {
                i += 1;
                while i < b.len() && b[i] != q && b[i] != b'\n' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'[' => {
                let before = text[..i].trim_end().as_bytes().last().copied();
                let ident = before.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_');
                if ident && matches!(next_significant(i + 1), Some(b'{' | b'<' | b']')) {
                    out.push_str(&text[last_start..i]);
                    inserted.push(out.len());
                    out.push(':');
                    last_start = i;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[last_start.min(text.len())..]);
    (out, inserted)
}

/// Parses the text of a `config.pbtxt`. The error names the line and column
/// and what is wrong there (an unknown field, a bad value, a syntax error).
pub fn parse_config(text: &str) -> std::result::Result<pb::ModelConfig, String> {
    let (fixed, inserted) = colons_before_message_lists(text);
    let msg = prost_reflect::DynamicMessage::parse_text_format(descriptor().clone(), &fixed)
        .map_err(|e| {
            let at = miette::Diagnostic::labels(&e)
                .and_then(|mut l| l.next())
                .map(|l| l.offset());
            match at {
                Some(off) => {
                    // Back to the offset in the file as written.
                    let off = off - inserted.iter().filter(|&&p| p < off).count();
                    let (line, col) = line_col(text, off);
                    format!("line {line}, column {col}: {e}")
                }
                None => e.to_string(),
            }
        })?;
    msg.transcode_to::<pb::ModelConfig>()
        .map_err(|e| format!("cannot read the configuration: {e}"))
}

fn dtype(field: &str, t: i32) -> Result<DType> {
    use pb::DataType as T;
    Ok(match T::try_from(t).unwrap_or(T::TypeInvalid) {
        T::TypeBool => DType::Bool,
        T::TypeUint8 => DType::U8,
        T::TypeUint16 => DType::U16,
        T::TypeUint32 => DType::U32,
        T::TypeUint64 => DType::U64,
        T::TypeInt8 => DType::I8,
        T::TypeInt16 => DType::I16,
        T::TypeInt32 => DType::I32,
        T::TypeInt64 => DType::I64,
        T::TypeFp16 => DType::F16,
        T::TypeFp32 => DType::F32,
        T::TypeFp64 => DType::F64,
        T::TypeString => DType::Bytes,
        T::TypeBf16 => DType::BF16,
        T::TypeInvalid => bail!("{field}.data_type: missing or TYPE_INVALID"),
    })
}

/// One tensor: `[-1]` (the batch) followed by `dims`, each fixed and positive.
pub(crate) fn tensor(field: &str, name: &str, data_type: i32, dims: &[i64]) -> Result<TensorMeta> {
    if name.is_empty() {
        bail!("{field}.name: empty");
    }
    let datatype = dtype(field, data_type)?;
    let mut bytes = datatype.size() as u64;
    for &d in dims {
        if d == -1 {
            bail!(
                "{field}.dims: -1 (a variable dimension) is not supported; every \
                 dimension after the batch must be fixed"
            );
        }
        if !(1..=DIM_MAX).contains(&d) {
            bail!("{field}.dims: {d} is not a dimension (1 to {DIM_MAX})");
        }
        bytes = bytes.saturating_mul(d as u64);
    }
    if bytes > MAX_SAMPLE_BYTES as u64 {
        bail!("{field}: one sample is {bytes} bytes; the limit is {MAX_SAMPLE_BYTES}");
    }
    let mut shape = vec![-1];
    shape.extend_from_slice(dims);
    Ok(TensorMeta {
        name: name.to_string(),
        datatype,
        shape,
        range: None,
    })
}

/// Maps a configuration onto Fermata's model metadata. `dir_name` is the
/// model's directory, which Triton requires `name` to match.
pub fn to_meta(c: &pb::ModelConfig, dir_name: &str) -> Result<ModelMeta> {
    use pb::model_config::SchedulingChoice;
    let name = if c.name.is_empty() {
        dir_name.to_string()
    } else if c.name != dir_name {
        bail!(
            "name: {:?}, but the model's directory is {dir_name:?}; they must match",
            c.name
        );
    } else {
        c.name.clone()
    };
    if c.platform == "ensemble"
        || matches!(
            c.scheduling_choice,
            Some(SchedulingChoice::EnsembleScheduling(_))
        )
    {
        bail!(
            "platform: \"ensemble\": an ensemble is an application, served by the frontend \
             over its models, not loaded as a model (docs/applications.md)"
        );
    }
    if !matches!(c.platform.as_str(), "" | "onnxruntime_onnx")
        || !matches!(c.backend.as_str(), "" | "onnxruntime")
    {
        bail!(
            "platform {:?} / backend {:?}: Fermata serves ONNX models (platform: \
             \"onnxruntime_onnx\" or backend: \"onnxruntime\")",
            c.platform,
            c.backend
        );
    }
    if !c.runtime.is_empty() {
        bail!(
            "runtime: {:?}: custom backend runtimes are not supported",
            c.runtime
        );
    }
    if c.max_batch_size <= 0 {
        bail!(
            "max_batch_size: {}: Fermata batches requests, so the model's first dimension \
             must be the batch and max_batch_size at least 1",
            c.max_batch_size
        );
    }
    let max_batch = u32::try_from(c.max_batch_size).expect("positive");
    if c.input.is_empty() {
        bail!("input: none listed (list each input with its name, data_type and dims)");
    }
    if c.output.is_empty() {
        bail!("output: none listed (list each output with its name, data_type and dims)");
    }
    let mut inputs = Vec::new();
    for (i, t) in c.input.iter().enumerate() {
        let f = format!("input[{i}]");
        if t.reshape.is_some() {
            bail!("{f}.reshape: not supported");
        }
        for (set, what) in [
            (t.is_shape_tensor, "is_shape_tensor"),
            (t.allow_ragged_batch, "allow_ragged_batch"),
            (t.optional, "optional"),
            (t.is_non_linear_format_io, "is_non_linear_format_io"),
        ] {
            if set {
                bail!("{f}.{what}: not supported");
            }
        }
        inputs.push(tensor(&f, &t.name, t.data_type, &t.dims)?);
    }
    let mut outputs = Vec::new();
    for (i, t) in c.output.iter().enumerate() {
        let f = format!("output[{i}]");
        if t.reshape.is_some() {
            bail!("{f}.reshape: not supported");
        }
        if !t.label_filename.is_empty() {
            bail!("{f}.label_filename: classification labels are not supported");
        }
        if t.is_shape_tensor || t.is_non_linear_format_io {
            bail!("{f}: shape tensors and non-linear formats are not supported");
        }
        outputs.push(tensor(&f, &t.name, t.data_type, &t.dims)?);
    }
    for (set, what) in [
        (!c.batch_input.is_empty(), "batch_input"),
        (!c.batch_output.is_empty(), "batch_output"),
        (!c.cc_model_filenames.is_empty(), "cc_model_filenames"),
        (
            c.model_operations
                .as_ref()
                .is_some_and(|o| !o.op_library_filename.is_empty()),
            "model_operations",
        ),
        (
            c.model_transaction_policy
                .as_ref()
                .is_some_and(|p| p.decoupled),
            "model_transaction_policy.decoupled",
        ),
        (
            c.model_repository_agents
                .as_ref()
                .is_some_and(|a| !a.agents.is_empty()),
            "model_repository_agents",
        ),
        (
            c.response_cache.as_ref().is_some_and(|r| r.enable),
            "response_cache",
        ),
        (
            c.optimization
                .as_ref()
                .and_then(|o| o.execution_accelerators.as_ref())
                .is_some_and(|a| {
                    !a.gpu_execution_accelerator.is_empty()
                        || !a.cpu_execution_accelerator.is_empty()
                }),
            "optimization.execution_accelerators",
        ),
    ] {
        if set {
            bail!("{what}: not supported");
        }
    }
    for (i, g) in c.instance_group.iter().enumerate() {
        let f = format!("instance_group[{i}]");
        if g.kind == pb::model_instance_group::Kind::Model as i32 {
            bail!("{f}.kind: KIND_MODEL is not supported (KIND_GPU, KIND_CPU or KIND_AUTO)");
        }
        if g.count < 0 {
            bail!("{f}.count: {} is negative", g.count);
        }
        if g.rate_limiter.is_some()
            || !g.secondary_devices.is_empty()
            || !g.profile.is_empty()
            || g.passive
            || !g.host_policy.is_empty()
        {
            bail!(
                "{f}: rate_limiter, secondary_devices, profile, passive and host_policy \
                 are not supported"
            );
        }
    }
    let mut slo_ms = None;
    let mut batch_buckets = None;
    match &c.scheduling_choice {
        Some(SchedulingChoice::SequenceBatching(_)) => {
            bail!("sequence_batching: stateful sequence models are not supported")
        }
        Some(SchedulingChoice::DynamicBatching(d)) => {
            if !d.priority_queue_policy.is_empty() {
                bail!("dynamic_batching.priority_queue_policy: not supported (one priority level)");
            }
            if !d.preferred_batch_size.is_empty() {
                let mut v = Vec::new();
                for &b in &d.preferred_batch_size {
                    if !(1..=c.max_batch_size).contains(&b) {
                        bail!(
                            "dynamic_batching.preferred_batch_size: {b} is not in 1..={}",
                            c.max_batch_size
                        );
                    }
                    v.push(b as u32);
                }
                v.sort_unstable();
                v.dedup();
                batch_buckets = Some(v);
            }
            if let Some(q) = &d.default_queue_policy {
                if q.timeout_action == pb::model_queue_policy::TimeoutAction::Delay as i32 {
                    bail!(
                        "dynamic_batching.default_queue_policy.timeout_action: DELAY is not \
                         supported (a request past its deadline is refused, as REJECT does)"
                    );
                }
                if q.default_timeout_microseconds > 0 {
                    slo_ms = Some(q.default_timeout_microseconds as f64 / 1e3);
                }
            }
        }
        Some(SchedulingChoice::EnsembleScheduling(_)) | None => {}
    }
    if let Some(p) = c.parameters.get(SLO_PARAMETER) {
        let v: f64 = p.string_value.trim().parse().map_err(|_| {
            anyhow!(
                "parameters[{SLO_PARAMETER:?}]: {:?} is not a number of milliseconds",
                p.string_value
            )
        })?;
        if !(v.is_finite() && v > 0.0 && v <= 3.6e6) {
            bail!(
                "parameters[{SLO_PARAMETER:?}]: {v} is not a positive SLO in ms (at most an hour)"
            );
        }
        slo_ms = Some(v);
    }
    let meta = ModelMeta {
        name,
        inputs,
        outputs,
        slo_ms: slo_ms.unwrap_or(DEFAULT_SLO_MS),
        max_batch,
        description: format!("Triton model configuration {dir_name}/{CONFIG_FILE}"),
        batch_buckets,
    };
    meta.validate()?;
    Ok(meta)
}

/// The version to serve of `available` (the model's numeric version
/// directories) under `policy` (Triton's default: the latest one). Fermata
/// serves one version of each model: a policy that selects several is refused.
pub fn choose_version(policy: Option<&pb::ModelVersionPolicy>, available: &[i64]) -> Result<i64> {
    use pb::model_version_policy::PolicyChoice;
    let mut avail = available.to_vec();
    avail.sort_unstable();
    avail.dedup();
    let Some(&latest) = avail.last() else {
        bail!("no version directory (a model's file goes in MODEL/1/{DEFAULT_MODEL_FILE})");
    };
    let chosen: Vec<i64> = match policy.and_then(|p| p.policy_choice.as_ref()) {
        None => vec![latest],
        Some(PolicyChoice::Latest(l)) => {
            let n = (l.num_versions.max(1) as usize).min(avail.len());
            avail[avail.len() - n..].to_vec()
        }
        Some(PolicyChoice::All(_)) => avail.clone(),
        Some(PolicyChoice::Specific(s)) => {
            let missing: Vec<i64> = s
                .versions
                .iter()
                .copied()
                .filter(|v| !avail.contains(v))
                .collect();
            if !missing.is_empty() {
                bail!(
                    "version_policy: specific version(s) {missing:?} have no directory \
                     (the model has {avail:?})"
                );
            }
            let mut v = s.versions.clone();
            v.sort_unstable();
            v.dedup();
            v
        }
    };
    match chosen.as_slice() {
        [v] => Ok(*v),
        [] => bail!("version_policy selects no version (the model has {avail:?})"),
        many => bail!(
            "version_policy selects versions {many:?}; Fermata serves one version of a \
             model (use latest {{ num_versions: 1 }} or specific {{ versions: [N] }})"
        ),
    }
}

/// A Triton model directory, resolved.
#[derive(Debug, Clone)]
pub struct TritonModel {
    pub meta: ModelMeta,
    /// The model's directory (profiles are kept here, beside `config.pbtxt`).
    pub dir: PathBuf,
    /// The version served.
    pub version: i64,
    /// Its model file.
    pub file: PathBuf,
}

/// Reads and parses `dir`'s `config.pbtxt` (at most [`CONFIG_BYTES_MAX`]):
/// its path and the configuration. Errors name the file.
pub fn read_config(dir: &Path) -> Result<(PathBuf, pb::ModelConfig)> {
    let cfg = dir.join(CONFIG_FILE);
    let len = std::fs::metadata(&cfg)
        .with_context(|| format!("reading {}", cfg.display()))?
        .len();
    if len > CONFIG_BYTES_MAX {
        bail!(
            "{}: {len} bytes; a model configuration may have at most {CONFIG_BYTES_MAX}",
            cfg.display()
        );
    }
    let text =
        std::fs::read_to_string(&cfg).with_context(|| format!("reading {}", cfg.display()))?;
    let config = parse_config(&text).map_err(|e| anyhow!("{}: {e}", cfg.display()))?;
    Ok((cfg, config))
}

/// Reads the Triton model directory `dir`: its configuration, the version to
/// serve and that version's model file. Errors name the file and the field.
pub fn load(dir: &Path) -> Result<TritonModel> {
    let (cfg, config) = read_config(dir)?;
    let dir_name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{}: the model directory's name is not UTF-8", dir.display()))?;
    let meta = to_meta(&config, dir_name).with_context(|| format!("{}", cfg.display()))?;
    let mut versions = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        if !e.file_type()?.is_dir() {
            continue;
        }
        // As Triton does, directories whose names are not numbers are not versions.
        if let Some(v) = e.file_name().to_str().and_then(|n| n.parse::<i64>().ok()) {
            if v >= 0 {
                versions.push(v);
            }
        }
    }
    let version = choose_version(config.version_policy.as_ref(), &versions)
        .with_context(|| format!("{}", cfg.display()))?;
    let fname = if config.default_model_filename.is_empty() {
        DEFAULT_MODEL_FILE
    } else {
        config.default_model_filename.as_str()
    };
    if fname.contains('/') || fname.contains('\\') || fname == ".." || fname == "." {
        bail!(
            "{}: default_model_filename {fname:?} must be a file name",
            cfg.display()
        );
    }
    let file = dir.join(version.to_string()).join(fname);
    if !file.is_file() {
        bail!(
            "{}: version {version} has no model file {}",
            cfg.display(),
            file.display()
        );
    }
    Ok(TritonModel {
        meta,
        dir: dir.to_path_buf(),
        version,
        file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta_of(text: &str) -> Result<ModelMeta> {
        let c = parse_config(text).map_err(anyhow::Error::msg)?;
        to_meta(&c, "m")
    }

    const GOOD: &str = r#"
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] } ]
"#;

    #[test]
    fn a_minimal_configuration_maps_to_metadata() {
        let m = meta_of(GOOD).unwrap();
        assert_eq!(m.name, "m");
        assert_eq!(m.max_batch, 8);
        assert_eq!(m.inputs[0].shape, vec![-1, 3, 4]);
        assert_eq!(m.inputs[0].datatype, DType::F32);
        assert_eq!(m.outputs[0].shape, vec![-1, 10]);
        assert_eq!(m.slo_ms, DEFAULT_SLO_MS);
        assert_eq!(m.batch_buckets, None);
    }

    #[test]
    fn slo_comes_from_the_parameter_then_the_queue_timeout() {
        let q = GOOD.to_string()
            + "dynamic_batching { preferred_batch_size: [ 4, 2, 4 ] max_queue_delay_microseconds: 100 \
               default_queue_policy { default_timeout_microseconds: 25000 } }";
        let m = meta_of(&q).unwrap();
        assert_eq!(m.slo_ms, 25.0);
        assert_eq!(m.batch_buckets, Some(vec![2, 4]));
        let p = q + r#" parameters { key: "slo_ms" value: { string_value: "40" } }"#;
        assert_eq!(meta_of(&p).unwrap().slo_ms, 40.0);
        let bad =
            GOOD.to_string() + r#"parameters { key: "slo_ms" value: { string_value: "soon" } }"#;
        assert!(meta_of(&bad).unwrap_err().to_string().contains("slo_ms"));
    }

    #[test]
    fn syntax_and_unknown_fields_name_line_and_field() {
        let e = parse_config("name: \"m\"\nmax_batch_size: 8\nbogus_field: 3\n").unwrap_err();
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("bogus_field"), "{e}");
        let e = parse_config("name: \"m\"\ninput [ { name: \"x\" data_type: TYPE_NOPE } ]")
            .unwrap_err();
        assert!(e.contains("line 2") && e.contains("TYPE_NOPE"), "{e}");
        let e = parse_config("max_batch_size: 99999999999").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = parse_config("input [ { name: \"x\" ").unwrap_err();
        assert!(!e.is_empty());
    }

    #[test]
    fn what_fermata_does_not_do_is_refused_by_field() {
        let cases = [
            ("platform: \"tensorrt_plan\"", "platform"),
            ("backend: \"python\"", "backend"),
            ("platform: \"ensemble\"", "ensemble"),
            ("sequence_batching { }", "sequence_batching"),
            ("response_cache { enable: true }", "response_cache"),
            ("model_transaction_policy { decoupled: true }", "decoupled"),
            (
                "instance_group [ { kind: KIND_MODEL } ]",
                "instance_group[0].kind",
            ),
            (
                "dynamic_batching { default_queue_policy { timeout_action: DELAY } }",
                "timeout_action",
            ),
            (
                "dynamic_batching { preferred_batch_size: [ 16 ] }",
                "preferred_batch_size",
            ),
        ];
        for (extra, field) in cases {
            let text = GOOD.replace("platform: \"onnxruntime_onnx\"", "") + extra;
            let e = meta_of(&text).unwrap_err().to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
        for (text, field) in [
            (
                GOOD.replace("max_batch_size: 8", "max_batch_size: 0"),
                "max_batch_size",
            ),
            (
                GOOD.replace("dims: [ 3, 4 ]", "dims: [ -1, 4 ]"),
                "input[0].dims",
            ),
            (
                GOOD.replace("dims: [ 10 ]", "dims: [ 0 ]"),
                "output[0].dims",
            ),
            (
                GOOD.replace("dims: [ 3, 4 ]", "dims: [ 2147483648, 2147483648 ]"),
                "input[0]",
            ),
            (
                GOOD.replace("TYPE_FP32 dims: [ 3", "TYPE_INVALID dims: [ 3"),
                "data_type",
            ),
            (GOOD.replace("name: \"m\"", "name: \"other\""), "name"),
        ] {
            let e = meta_of(&text).unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn harmless_settings_are_accepted() {
        let text = GOOD.to_string()
            + r#"
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
model_warmup [ { name: "w" batch_size: 1 } ]
optimization { input_pinned_memory { enable: true } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"#;
        meta_of(&text).unwrap();
        // Without platform and backend an ONNX model is assumed, as Triton's
        // auto-completion does for model.onnx.
        meta_of(&GOOD.replace("platform: \"onnxruntime_onnx\"", "")).unwrap();
        meta_of(&GOOD.replace("platform: \"onnxruntime_onnx\"", "backend: \"onnxruntime\""))
            .unwrap();
    }

    #[test]
    fn versions_follow_the_policy_and_one_is_served() {
        use pb::model_version_policy::{All, Latest, PolicyChoice, Specific};
        let p = |c| pb::ModelVersionPolicy {
            policy_choice: Some(c),
        };
        assert_eq!(choose_version(None, &[1, 3, 2]).unwrap(), 3);
        assert_eq!(
            choose_version(
                Some(&p(PolicyChoice::Latest(Latest { num_versions: 1 }))),
                &[1, 7]
            )
            .unwrap(),
            7
        );
        assert!(choose_version(
            Some(&p(PolicyChoice::Latest(Latest { num_versions: 2 }))),
            &[1, 7]
        )
        .is_err());
        assert_eq!(
            choose_version(
                Some(&p(PolicyChoice::Latest(Latest { num_versions: 2 }))),
                &[4]
            )
            .unwrap(),
            4
        );
        assert_eq!(
            choose_version(Some(&p(PolicyChoice::All(All {}))), &[5]).unwrap(),
            5
        );
        assert!(choose_version(Some(&p(PolicyChoice::All(All {}))), &[5, 6]).is_err());
        assert_eq!(
            choose_version(
                Some(&p(PolicyChoice::Specific(Specific { versions: vec![1] }))),
                &[1, 2]
            )
            .unwrap(),
            1
        );
        let e = choose_version(
            Some(&p(PolicyChoice::Specific(Specific { versions: vec![9] }))),
            &[1],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("[9]"), "{e}");
        assert!(choose_version(None, &[]).is_err());
    }

    #[test]
    fn colons_go_before_lists_of_messages_only() {
        let (t, at) = colons_before_message_lists(
            "input [ { dims: [ 1 ] } ]\n# a [ { comment\nname: \"x [ { y\" output\n[\n{ } ]\nv [ ]",
        );
        assert_eq!(
            t,
            "input :[ { dims: [ 1 ] } ]\n# a [ { comment\nname: \"x [ { y\" output\n:[\n{ } ]\nv :[ ]"
        );
        assert_eq!(at.len(), 3);
        assert_eq!(colons_before_message_lists("a: [1, 2]").0, "a: [1, 2]");
        // A parse error after an inserted colon still names the column as written.
        let e = parse_config("input [ { name: \"x\" } ] bogus: 1").unwrap_err();
        assert!(e.contains("line 1, column 25"), "{e}");
    }

    #[test]
    fn line_and_column_count_from_one() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("ab", 99), (1, 3));
    }
}
