//! Applications in the model repository: Triton ensembles.
//!
//! An application is a Triton model directory whose `config.pbtxt` says
//! `platform: "ensemble"` and lists its steps under `ensemble_scheduling`, each
//! naming a model of the same repository with an `input_map` (model input →
//! ensemble tensor) and an `output_map` (model output → ensemble tensor), as
//! Triton users write them. Three Fermata parameters say what Triton has no
//! field for (docs/applications.md, "Serving an application"):
//!
//! * `fermata.fanout`: the ensemble tensors that fan out, comma-separated, each
//!   `TENSOR` or `TENSOR:COUNT`. A fanned tensor of one sample has shape
//!   `[K, ...]`; each of its first `N` rows becomes one request to every step
//!   that reads it, whose input is one row (`[...]`). `N` is the value of the
//!   ensemble tensor `COUNT` (one integer per sample, produced by the same step)
//!   or, without one, `K`. Fermata's tensors have a fixed size per sample (the
//!   frontend's region and the backends' pulls are per sample), so a variable
//!   leading dimension is written as a capacity and a count, the layout
//!   detectors with a fixed number of slots already use (TensorRT's
//!   EfficientNMS: `num_detections` beside `detection_boxes [K, 4]`).
//! * `fermata.deadline`: `slack-forwarding` (the default), `static` or
//!   `latest-useful`.
//! * `fermata.budgets_ms`: `STEP=MS, ...`, each step's latency budget; without
//!   it the SLO is split in proportion to each step's l(1) so that the longest
//!   path's budgets add up to the SLO.
//!
//! The SLO is `parameters { key: "slo_ms" ... }` (default 100 ms), as for a
//! model. Parsing ([`parse`]) checks the file on its own; [`resolve`] checks the
//! wiring against the step models' tensors. Both are pure; errors name the
//! file's field.

use crate::repo::{DType, ModelMeta, TensorMeta};
use crate::triton_repo::{pb, CONFIG_BYTES_MAX, CONFIG_FILE, DEFAULT_SLO_MS, SLO_PARAMETER};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The parameter that lists the fanned-out tensors.
pub const FANOUT_PARAMETER: &str = "fermata.fanout";
/// The parameter that names the deadline rule.
pub const DEADLINE_PARAMETER: &str = "fermata.deadline";
/// The parameter that gives the steps' budgets.
pub const BUDGETS_PARAMETER: &str = "fermata.budgets_ms";
/// The most steps an application may have.
pub const STEPS_MAX: usize = 64;

/// How each task of an application gets its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Arrival plus the budgets cumulative along the path to the step.
    Static,
    /// The application's deadline minus the budgets of the steps still to run.
    SlackForwarding,
    /// Slack forwarding's deadline, and a task dropped at it gets a last one:
    /// the application's deadline minus the least latencies of the steps still
    /// to run.
    LatestUseful,
}

/// One step as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsembleStep {
    /// Unique in the application: the model's name, or `MODEL#k` for its k-th
    /// use (from 2) when the ensemble runs a model more than once.
    pub name: String,
    pub model: String,
    /// Model input → ensemble tensor, sorted by model input.
    pub input_map: BTreeMap<String, String>,
    /// Model output → ensemble tensor, sorted by model output.
    pub output_map: BTreeMap<String, String>,
}

/// A fanned-out ensemble tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fanout {
    pub tensor: String,
    /// The ensemble tensor that holds its item count (None: every row).
    pub count: Option<String>,
}

/// An ensemble's configuration, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct EnsembleConfig {
    pub name: String,
    /// Its `config.pbtxt` (errors name it).
    pub file: PathBuf,
    /// The application's inputs and outputs (`[-1, dims...]`).
    pub inputs: Vec<TensorMeta>,
    pub outputs: Vec<TensorMeta>,
    /// The most samples a client's request may carry.
    pub max_batch: u32,
    pub slo_ms: f64,
    pub steps: Vec<EnsembleStep>,
    pub fanout: Vec<Fanout>,
    pub rule: Rule,
    /// Budgets by step name, when given.
    pub budgets_ms: Option<Vec<(String, f64)>>,
}

/// Whether `dir` is a Triton model directory holding an ensemble (its
/// configuration says `platform: "ensemble"` or has `ensemble_scheduling`). A
/// configuration that does not parse is not taken for one: loading it as a
/// model reports its error.
pub fn is_ensemble_dir(dir: &Path) -> bool {
    let cfg = dir.join(CONFIG_FILE);
    let Ok(md) = std::fs::metadata(&cfg) else {
        return false;
    };
    if !md.is_file() || md.len() > CONFIG_BYTES_MAX {
        return false;
    }
    let Ok(text) = std::fs::read_to_string(&cfg) else {
        return false;
    };
    crate::triton_repo::parse_config(&text).is_ok_and(|c| is_ensemble(&c))
}

/// Whether a configuration is an ensemble's.
pub fn is_ensemble(c: &pb::ModelConfig) -> bool {
    c.platform == "ensemble"
        || matches!(
            c.scheduling_choice,
            Some(pb::model_config::SchedulingChoice::EnsembleScheduling(_))
        )
}

/// Reads the ensemble of directory `dir`. Errors name the file and the field.
pub fn load(dir: &Path) -> Result<EnsembleConfig> {
    let (cfg, config) = crate::triton_repo::read_config(dir)?;
    let dir_name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{}: the directory's name is not UTF-8", dir.display()))?;
    let mut e = parse(&config, dir_name).with_context(|| format!("{}", cfg.display()))?;
    e.file = cfg;
    Ok(e)
}

/// Every ensemble of the repository `dir`, sorted by name.
pub fn load_all(dir: &Path) -> Result<Vec<EnsembleConfig>> {
    let rd = std::fs::read_dir(dir)
        .with_context(|| format!("reading the model repository {}", dir.display()))?;
    let mut dirs: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| is_ensemble_dir(p))
        .collect();
    dirs.sort();
    dirs.iter().map(|d| load(d)).collect()
}

fn tensors(field: &str, list: &[(String, i32, Vec<i64>)]) -> Result<Vec<TensorMeta>> {
    let mut out: Vec<TensorMeta> = Vec::new();
    for (i, (name, dt, dims)) in list.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let t = crate::triton_repo::tensor(&f, name, *dt, dims)?;
        if out.iter().any(|o| o.name == t.name) {
            bail!("{f}.name: {:?} is listed twice", t.name);
        }
        out.push(t);
    }
    Ok(out)
}

/// Maps an ensemble's configuration (of directory `dir_name`) onto an
/// [`EnsembleConfig`]: its tensors, steps and Fermata's parameters, each
/// checked on its own ([`resolve`] checks them against the models).
pub fn parse(c: &pb::ModelConfig, dir_name: &str) -> Result<EnsembleConfig> {
    use pb::model_config::SchedulingChoice;
    let name = if c.name.is_empty() {
        dir_name.to_string()
    } else if c.name != dir_name {
        bail!(
            "name: {:?}, but the directory is {dir_name:?}; they must match",
            c.name
        );
    } else {
        c.name.clone()
    };
    if c.platform != "ensemble" {
        bail!(
            "platform: {:?}: an ensemble_scheduling needs platform: \"ensemble\"",
            c.platform
        );
    }
    let Some(SchedulingChoice::EnsembleScheduling(sched)) = &c.scheduling_choice else {
        bail!("ensemble_scheduling: missing (list the steps: step [ {{ model_name ... }} ])");
    };
    if c.max_batch_size <= 0 {
        bail!(
            "max_batch_size: {}: Fermata runs each sample of a request as its own \
             application request, so the first dimension is the batch and \
             max_batch_size must be at least 1",
            c.max_batch_size
        );
    }
    let max_batch = u32::try_from(c.max_batch_size.min(1024)).expect("positive");
    let ins: Vec<_> = c
        .input
        .iter()
        .map(|t| (t.name.clone(), t.data_type, t.dims.clone()))
        .collect();
    let outs: Vec<_> = c
        .output
        .iter()
        .map(|t| (t.name.clone(), t.data_type, t.dims.clone()))
        .collect();
    if ins.is_empty() {
        bail!("input: none listed");
    }
    if outs.is_empty() {
        bail!("output: none listed");
    }
    let inputs = tensors("input", &ins)?;
    let outputs = tensors("output", &outs)?;
    if sched.step.is_empty() {
        bail!("ensemble_scheduling.step: none listed");
    }
    if sched.step.len() > STEPS_MAX {
        bail!(
            "ensemble_scheduling.step: {} steps; at most {STEPS_MAX}",
            sched.step.len()
        );
    }
    let mut steps = Vec::new();
    let mut uses: HashMap<&str, usize> = HashMap::new();
    for (i, s) in sched.step.iter().enumerate() {
        let f = format!("ensemble_scheduling.step[{i}]");
        if s.model_name.is_empty() {
            bail!("{f}.model_name: empty");
        }
        if s.model_name == name {
            bail!("{f}.model_name: the ensemble cannot run itself");
        }
        if s.model_version > 1 {
            bail!(
                "{f}.model_version: {}: Fermata serves one version of a model, version 1 \
                 (or -1: the one served)",
                s.model_version
            );
        }
        if !s.model_namespace.is_empty() {
            bail!("{f}.model_namespace: not supported");
        }
        if s.input_map.is_empty() {
            bail!("{f}.input_map: empty (map every input of the model to an ensemble tensor)");
        }
        if s.output_map.is_empty() {
            bail!("{f}.output_map: empty (map the outputs used to ensemble tensors)");
        }
        let k = uses.entry(s.model_name.as_str()).or_insert(0);
        *k += 1;
        let step_name = if *k == 1 {
            s.model_name.clone()
        } else {
            format!("{}#{k}", s.model_name)
        };
        steps.push(EnsembleStep {
            name: step_name,
            model: s.model_name.clone(),
            input_map: s
                .input_map
                .iter()
                .map(|(a, b)| (a.clone(), b.clone()))
                .collect(),
            output_map: s
                .output_map
                .iter()
                .map(|(a, b)| (a.clone(), b.clone()))
                .collect(),
        });
    }
    let param = |k: &str| {
        c.parameters
            .get(k)
            .map(|p| p.string_value.trim().to_string())
    };
    let mut fanout = Vec::new();
    if let Some(v) = param(FANOUT_PARAMETER) {
        for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (tensor, count) = match item.split_once(':') {
                Some((t, n)) => (t.trim(), Some(n.trim())),
                None => (item, None),
            };
            if tensor.is_empty() || count.is_some_and(str::is_empty) {
                bail!("parameters[{FANOUT_PARAMETER:?}]: {item:?} is not TENSOR or TENSOR:COUNT");
            }
            if fanout.iter().any(|f: &Fanout| f.tensor == tensor) {
                bail!("parameters[{FANOUT_PARAMETER:?}]: tensor {tensor:?} is listed twice");
            }
            fanout.push(Fanout {
                tensor: tensor.to_string(),
                count: count.map(str::to_string),
            });
        }
    }
    let rule = match param(DEADLINE_PARAMETER).as_deref() {
        None | Some("slack-forwarding") | Some("slack_forwarding") => Rule::SlackForwarding,
        Some("static") => Rule::Static,
        Some("latest-useful") | Some("latest_useful") => Rule::LatestUseful,
        Some(other) => bail!(
            "parameters[{DEADLINE_PARAMETER:?}]: {other:?} is not a deadline rule \
             (static, slack-forwarding or latest-useful)"
        ),
    };
    let slo_ms = match param(SLO_PARAMETER) {
        None => DEFAULT_SLO_MS,
        Some(s) => {
            let v: f64 = s.parse().map_err(|_| {
                anyhow!("parameters[{SLO_PARAMETER:?}]: {s:?} is not a number of milliseconds")
            })?;
            if !(v.is_finite() && v > 0.0 && v <= 3.6e6) {
                bail!("parameters[{SLO_PARAMETER:?}]: {v} is not a positive SLO in ms (at most an hour)");
            }
            v
        }
    };
    let budgets_ms = match param(BUDGETS_PARAMETER) {
        None => None,
        Some(v) => {
            let mut out: Vec<(String, f64)> = Vec::new();
            for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let bad = || {
                    anyhow!(
                        "parameters[{BUDGETS_PARAMETER:?}]: {item:?} is not STEP=MS \
                         (a step's name and a positive budget in ms)"
                    )
                };
                let (s, ms) = item.split_once('=').ok_or_else(bad)?;
                let ms: f64 = ms.trim().parse().map_err(|_| bad())?;
                if !(ms.is_finite() && ms > 0.0 && ms <= 3.6e6) {
                    return Err(bad());
                }
                let s = s.trim();
                if !steps.iter().any(|st| st.name == s) {
                    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
                    bail!(
                        "parameters[{BUDGETS_PARAMETER:?}]: no step {s:?} (the steps: {})",
                        names.join(", ")
                    );
                }
                if out.iter().any(|(o, _)| o == s) {
                    bail!("parameters[{BUDGETS_PARAMETER:?}]: step {s:?} is listed twice");
                }
                out.push((s.to_string(), ms));
            }
            if out.len() != steps.len() {
                let missing: Vec<&str> = steps
                    .iter()
                    .map(|s| s.name.as_str())
                    .filter(|n| !out.iter().any(|(o, _)| o == n))
                    .collect();
                bail!(
                    "parameters[{BUDGETS_PARAMETER:?}]: no budget for step(s) {} (give every \
                     step one, or none to split the SLO by the steps' l(1))",
                    missing.join(", ")
                );
            }
            Some(out)
        }
    };
    Ok(EnsembleConfig {
        name,
        file: PathBuf::from(format!("{dir_name}/{CONFIG_FILE}")),
        inputs,
        outputs,
        max_batch,
        slo_ms,
        steps,
        fanout,
        rule,
        budgets_ms,
    })
}

/// Where an ensemble tensor comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The application's input of this index.
    AppInput(usize),
    /// Output `output` (index in the model's outputs) of step `step`.
    Step { step: usize, output: usize },
}

/// One input of a step's model, in the model's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepInput {
    pub source: Source,
    /// One row of a fanned tensor (the row is the task's item on the edge
    /// from the source step), rather than the whole tensor.
    pub row: bool,
}

/// A step-level edge: `from` feeds `to`; `fanout` when a fanned tensor flows
/// on it, with its item count (`count`: output index of `from`'s model holding
/// it; None: the fanned tensor's first dimension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireEdge {
    pub from: usize,
    pub to: usize,
    pub fanout: Option<FanoutCount>,
}

/// How the item count of a fan-out edge is read from its parent's outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanoutCount {
    /// The fanned output (index in the parent model's outputs) and its rows K.
    pub output: usize,
    pub rows: u32,
    /// The output holding N (one integer), or None: N = K.
    pub count: Option<usize>,
}

/// An ensemble checked against its models: each step's inputs, the
/// step-level edges, and where each application output comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Wiring {
    /// Per step: its model's inputs in order.
    pub step_inputs: Vec<Vec<StepInput>>,
    pub edges: Vec<WireEdge>,
    /// Per application output: (step, output index of its model).
    pub outputs: Vec<(usize, usize)>,
    /// Per step: its budget (ms).
    pub budgets_ms: Vec<f64>,
}

fn same_tensor(a: &TensorMeta, dt: DType, sample: &[i64]) -> bool {
    a.datatype == dt && a.sample_shape() == sample
}

fn shape_text(dt: DType, s: &[i64]) -> String {
    format!("{} {s:?}", dt.kserve_name())
}

/// Checks `e` against the models it runs (`model(name)`: the model's
/// metadata and its l(1) in ms, None when the repository has no such model)
/// and wires it.
pub fn resolve(
    e: &EnsembleConfig,
    model: impl Fn(&str) -> Option<(ModelMeta, f64)>,
) -> Result<Wiring> {
    let n = e.steps.len();
    let mut metas = Vec::with_capacity(n);
    let mut l1 = Vec::with_capacity(n);
    for (i, s) in e.steps.iter().enumerate() {
        let (m, l) = model(&s.model).ok_or_else(|| {
            anyhow!(
                "ensemble_scheduling.step[{i}].model_name: no model {:?} in the repository",
                s.model
            )
        })?;
        metas.push(m);
        l1.push(l);
    }
    // Each ensemble tensor's producer.
    let mut produced: HashMap<&str, (usize, usize)> = HashMap::new();
    for (i, s) in e.steps.iter().enumerate() {
        for (mo, t) in &s.output_map {
            let f = format!("ensemble_scheduling.step[{i}].output_map[{mo:?}]");
            let o = metas[i]
                .outputs
                .iter()
                .position(|x| &x.name == mo)
                .ok_or_else(|| {
                    anyhow!(
                        "{f}: model {:?} has no output {mo:?} (its outputs: {})",
                        s.model,
                        names(&metas[i].outputs)
                    )
                })?;
            if e.inputs.iter().any(|x| &x.name == t) {
                bail!("{f}: {t:?} is an input of the ensemble; a step cannot produce it");
            }
            if produced.insert(t.as_str(), (i, o)).is_some() {
                bail!("{f}: ensemble tensor {t:?} is produced by two steps");
            }
        }
    }
    let fan: HashMap<&str, &Fanout> = e.fanout.iter().map(|f| (f.tensor.as_str(), f)).collect();
    let mut counts: HashMap<&str, FanoutCount> = HashMap::new();
    for f in &e.fanout {
        let p = format!("parameters[{FANOUT_PARAMETER:?}]");
        let &(step, out) = produced.get(f.tensor.as_str()).ok_or_else(|| {
            anyhow!(
                "{p}: {:?} is not produced by a step (a fanned tensor is a step's output_map value)",
                f.tensor
            )
        })?;
        let t = &metas[step].outputs[out];
        let rows = t.sample_shape().first().copied().ok_or_else(|| {
            anyhow!(
                "{p}: {:?} (output {:?} of model {:?}) has no leading dimension to fan out",
                f.tensor,
                t.name,
                e.steps[step].model
            )
        })?;
        let count = match &f.count {
            None => None,
            Some(c) => {
                let &(cs, co) = produced.get(c.as_str()).ok_or_else(|| {
                    anyhow!(
                        "{p}: the count {c:?} of {:?} is not produced by a step",
                        f.tensor
                    )
                })?;
                if cs != step {
                    bail!(
                        "{p}: the count {c:?} of {:?} comes from step {:?}, the tensor from {:?}; \
                         both must come from one step",
                        f.tensor,
                        e.steps[cs].name,
                        e.steps[step].name
                    );
                }
                let ct = &metas[cs].outputs[co];
                let int = matches!(
                    ct.datatype,
                    DType::I8
                        | DType::I16
                        | DType::I32
                        | DType::I64
                        | DType::U8
                        | DType::U16
                        | DType::U32
                        | DType::U64
                );
                if !int || ct.sample_elems() != 1 {
                    bail!(
                        "{p}: the count {c:?} is {}; it must be one integer per sample",
                        shape_text(ct.datatype, ct.sample_shape())
                    );
                }
                Some(co)
            }
        };
        counts.insert(
            f.tensor.as_str(),
            FanoutCount {
                output: out,
                rows: rows as u32,
                count,
            },
        );
    }
    let mut step_inputs = Vec::with_capacity(n);
    let mut edges: Vec<WireEdge> = Vec::new();
    for (i, s) in e.steps.iter().enumerate() {
        let m = &metas[i];
        let mut list = Vec::with_capacity(m.inputs.len());
        for mi in s.input_map.keys() {
            if !m.inputs.iter().any(|x| &x.name == mi) {
                bail!(
                    "ensemble_scheduling.step[{i}].input_map[{mi:?}]: model {:?} has no input \
                     {mi:?} (its inputs: {})",
                    s.model,
                    names(&m.inputs)
                );
            }
        }
        for inp in &m.inputs {
            let f = format!("ensemble_scheduling.step[{i}].input_map");
            let t = s.input_map.get(&inp.name).ok_or_else(|| {
                anyhow!(
                    "{f}: input {:?} of model {:?} is not mapped (map every input)",
                    inp.name,
                    s.model
                )
            })?;
            let f = format!("{f}[{:?}]", inp.name);
            if let Some(a) = e.inputs.iter().position(|x| &x.name == t) {
                let at = &e.inputs[a];
                if !same_tensor(inp, at.datatype, at.sample_shape()) {
                    bail!(
                        "{f}: the ensemble's input {t:?} is {}, model {:?}'s input {:?} is {}",
                        shape_text(at.datatype, at.sample_shape()),
                        s.model,
                        inp.name,
                        shape_text(inp.datatype, inp.sample_shape())
                    );
                }
                list.push(StepInput {
                    source: Source::AppInput(a),
                    row: false,
                });
                continue;
            }
            let &(p, o) = produced.get(t.as_str()).ok_or_else(|| {
                anyhow!("{f}: {t:?} is neither an input of the ensemble nor a step's output")
            })?;
            if p == i {
                bail!("{f}: step {:?} reads its own output {t:?}", s.name);
            }
            let pt = &metas[p].outputs[o];
            let row = fan.contains_key(t.as_str());
            let want: &[i64] = if row {
                &pt.sample_shape()[1..]
            } else {
                pt.sample_shape()
            };
            if !same_tensor(inp, pt.datatype, want) {
                bail!(
                    "{f}: {t:?}{} is {}, model {:?}'s input {:?} is {}",
                    if row { " (one fanned row)" } else { "" },
                    shape_text(pt.datatype, want),
                    s.model,
                    inp.name,
                    shape_text(inp.datatype, inp.sample_shape())
                );
            }
            list.push(StepInput {
                source: Source::Step { step: p, output: o },
                row,
            });
            let fc = row.then(|| counts[t.as_str()].clone());
            match edges.iter_mut().find(|x| x.from == p && x.to == i) {
                None => edges.push(WireEdge {
                    from: p,
                    to: i,
                    fanout: fc,
                }),
                Some(x) => match (&x.fanout, fc) {
                    (Some(a), Some(b)) if a.output != b.output => bail!(
                        "{f}: step {:?} reads two fanned tensors of step {:?}; one fanned \
                         tensor may flow on an edge",
                        s.name,
                        e.steps[p].name
                    ),
                    (None, Some(b)) => x.fanout = Some(b),
                    _ => {}
                },
            }
        }
        step_inputs.push(list);
    }
    let mut outputs = Vec::new();
    for (k, ot) in e.outputs.iter().enumerate() {
        let f = format!("output[{k}]");
        let &(p, o) = produced.get(ot.name.as_str()).ok_or_else(|| {
            anyhow!(
                "{f}: {:?} is not produced by a step (an output is a step's output_map value)",
                ot.name
            )
        })?;
        let pt = &metas[p].outputs[o];
        if !same_tensor(ot, pt.datatype, pt.sample_shape()) {
            bail!(
                "{f}: declared {}, but step {:?} produces {}",
                shape_text(ot.datatype, ot.sample_shape()),
                e.steps[p].name,
                shape_text(pt.datatype, pt.sample_shape())
            );
        }
        outputs.push((p, o));
    }
    let budgets_ms = match &e.budgets_ms {
        Some(b) => e
            .steps
            .iter()
            .map(|s| b.iter().find(|(n, _)| n == &s.name).expect("checked").1)
            .collect(),
        None => split_slo(e.slo_ms, &l1, &edges),
    };
    Ok(Wiring {
        step_inputs,
        edges,
        outputs,
        budgets_ms,
    })
}

/// The SLO split in proportion to each step's l(1), scaled so that the
/// longest path's budgets add up to the SLO (a path's steps run one after the
/// other). Steps are in any order; `edges` form a DAG.
pub fn split_slo(slo_ms: f64, l1: &[f64], edges: &[WireEdge]) -> Vec<f64> {
    let n = l1.len();
    let l: Vec<f64> = l1.iter().map(|&x| x.max(1e-6)).collect();
    // Longest path ending at each step, by relaxing n times (n ≤ STEPS_MAX).
    let mut upto = l.clone();
    for _ in 0..n {
        for e in edges {
            let v = upto[e.from] + l[e.to];
            if v > upto[e.to] {
                upto[e.to] = v;
            }
        }
    }
    let longest = upto.iter().copied().fold(0.0, f64::max);
    l.iter().map(|&x| slo_ms * x / longest).collect()
}

fn names(ts: &[TensorMeta]) -> String {
    ts.iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, dt: DType, dims: &[i64]) -> TensorMeta {
        let mut shape = vec![-1];
        shape.extend_from_slice(dims);
        TensorMeta {
            name: name.into(),
            datatype: dt,
            shape,
            range: None,
        }
    }

    fn models(name: &str) -> Option<(ModelMeta, f64)> {
        let m = |n: &str, ins, outs, l| {
            Some((
                ModelMeta {
                    name: n.into(),
                    inputs: ins,
                    outputs: outs,
                    slo_ms: 10.0,
                    max_batch: 8,
                    description: String::new(),
                    batch_buckets: None,
                },
                l,
            ))
        };
        match name {
            "det" => m(
                "det",
                vec![t("image", DType::F32, &[8, 4])],
                vec![
                    t("boxes", DType::F32, &[8, 4]),
                    t("n", DType::I64, &[1]),
                    t("scores", DType::F32, &[8]),
                ],
                1.0,
            ),
            "cls" => m(
                "cls",
                vec![t("x", DType::F32, &[4])],
                vec![t("y", DType::F32, &[3])],
                3.0,
            ),
            _ => None,
        }
    }

    const APP: &str = r#"
name: "app"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 8, 4 ] } ]
output [ { name: "LABELS" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "det" model_version: -1
    input_map { key: "image" value: "IMAGE" }
    output_map { key: "boxes" value: "BOXES" }
    output_map { key: "n" value: "COUNT" } },
  { model_name: "cls" model_version: -1
    input_map { key: "x" value: "BOXES" }
    output_map { key: "y" value: "LABELS" } } ] }
parameters { key: "fermata.fanout" value: { string_value: "BOXES:COUNT" } }
parameters { key: "slo_ms" value: { string_value: "40" } }
"#;

    fn parsed(text: &str) -> Result<EnsembleConfig> {
        let c = crate::triton_repo::parse_config(text).map_err(anyhow::Error::msg)?;
        parse(&c, "app")
    }

    #[test]
    fn an_ensemble_parses_and_wires_with_its_fanout() {
        let e = parsed(APP).unwrap();
        assert_eq!(e.steps.len(), 2);
        assert_eq!(e.rule, Rule::SlackForwarding);
        assert_eq!(e.slo_ms, 40.0);
        let w = resolve(&e, models).unwrap();
        assert_eq!(
            w.edges,
            vec![WireEdge {
                from: 0,
                to: 1,
                fanout: Some(FanoutCount {
                    output: 0,
                    rows: 8,
                    count: Some(1)
                })
            }]
        );
        assert_eq!(w.outputs, vec![(1, 0), (0, 1)]);
        assert_eq!(
            w.step_inputs[1],
            vec![StepInput {
                source: Source::Step { step: 0, output: 0 },
                row: true
            }]
        );
        // l(1) 1 and 3 ms: the 40 ms split 10 / 30.
        assert!((w.budgets_ms[0] - 10.0).abs() < 1e-9 && (w.budgets_ms[1] - 30.0).abs() < 1e-9);
    }

    #[test]
    fn parameters_are_checked_by_name() {
        let with = |p: &str| APP.to_string() + &format!("parameters {{ key: {p} }}\n");
        let e = parsed(&with(
            r#""fermata.budgets_ms" value: { string_value: "det=5, cls=20" }"#,
        ))
        .unwrap();
        assert_eq!(resolve(&e, models).unwrap().budgets_ms, vec![5.0, 20.0]);
        let e = parsed(&with(
            r#""fermata.deadline" value: { string_value: "static" }"#,
        ))
        .unwrap();
        assert_eq!(e.rule, Rule::Static);
        let e = parsed(&with(
            r#""fermata.deadline" value: { string_value: "latest-useful" }"#,
        ))
        .unwrap();
        assert_eq!(e.rule, Rule::LatestUseful);
        for (p, field) in [
            (
                r#""fermata.deadline" value: { string_value: "soon" }"#,
                "fermata.deadline",
            ),
            (
                r#""fermata.budgets_ms" value: { string_value: "det=5" }"#,
                "cls",
            ),
            (
                r#""fermata.budgets_ms" value: { string_value: "det=5,cls=x" }"#,
                "STEP=MS",
            ),
            (
                r#""fermata.budgets_ms" value: { string_value: "det=5,zz=1" }"#,
                "zz",
            ),
        ] {
            let e = parsed(&with(p)).unwrap_err().to_string();
            assert!(e.contains(field), "{p}: {e}");
        }
    }

    #[test]
    fn bad_wiring_is_refused_naming_the_field() {
        for (from, to, field) in [
            // Without the fan-out, cls would get [8, 4].
            (
                r#"parameters { key: "fermata.fanout" value: { string_value: "BOXES:COUNT" } }"#,
                "",
                "step[1].input_map",
            ),
            (
                "model_name: \"cls\"",
                "model_name: \"nope\"",
                "step[1].model_name",
            ),
            (
                "key: \"x\" value: \"BOXES\"",
                "key: \"x\" value: \"NOPE\"",
                "NOPE",
            ),
            ("key: \"y\" value", "key: \"z\" value", "output_map[\"z\"]"),
            ("BOXES:COUNT", "BOXES:LABELS", "count"),
            ("BOXES:COUNT", "IMAGE", "fermata.fanout"),
            ("dims: [ 3 ]", "dims: [ 4 ]", "output[0]"),
        ] {
            let text = APP.replace(from, to);
            let r = parsed(&text).and_then(|e| resolve(&e, models));
            let e = format!("{:#}", r.unwrap_err());
            assert!(e.contains(field), "{to}: {e}");
        }
        for (from, to, field) in [
            ("platform: \"ensemble\"", "", "platform"),
            ("max_batch_size: 4", "max_batch_size: 0", "max_batch_size"),
            ("model_version: -1", "model_version: 2", "model_version"),
        ] {
            let e = format!("{:#}", parsed(&APP.replacen(from, to, 1)).unwrap_err());
            assert!(e.contains(field), "{to}: {e}");
        }
    }

    #[test]
    fn the_slo_split_fills_the_longest_path() {
        // a → b, a → c → d: the longest path by l(1) is a → b.
        let e = |from, to| WireEdge {
            from,
            to,
            fanout: None,
        };
        let b = split_slo(100.0, &[1.0, 5.0, 2.0, 2.0], &[e(0, 1), e(0, 2), e(2, 3)]);
        assert!((b[0] + b[1] - 100.0).abs() < 1e-9, "{b:?}");
        assert!(b[0] + b[2] + b[3] <= 100.0 + 1e-9, "{b:?}");
    }
}
