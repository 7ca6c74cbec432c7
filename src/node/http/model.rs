//! A model as the HTTP API shows it ([`HttpModel`]): its tensors (from its
//! metadata, or synthesized for emulated, profile-only models) and its KServe v2
//! metadata document.

use crate::node::exec::profile_of;
use crate::repo::{DType, ModelMeta, TensorMeta};
use crate::wire::ModelInfo;
use serde_json::{json, Value};

/// A model as the HTTP API shows it.
pub(in crate::node) struct HttpModel {
    pub(in crate::node) info: ModelInfo,
    /// Its tensors (synthesized for emulated models), or why its metadata is bad.
    pub(in crate::node) meta: Result<ModelMeta, String>,
}

impl HttpModel {
    pub(in crate::node) fn new(info: &ModelInfo) -> HttpModel {
        let meta = match info.meta() {
            Some(m) => m,
            None => Ok(ModelMeta {
                name: info.name.clone(),
                inputs: vec![TensorMeta {
                    name: "input".into(),
                    datatype: DType::U8,
                    shape: vec![-1, info.input_bytes as i64],
                    range: None,
                }],
                outputs: vec![TensorMeta {
                    name: "output".into(),
                    datatype: DType::U8,
                    shape: vec![-1, 16],
                    range: None,
                }],
                slo_ms: info.slo.as_ms_f64(),
                max_batch: profile_of(&info.profile).map_or(1, |p| p.max_batch()),
                description: "emulated (profile only)".into(),
                batch_buckets: None,
            }),
        };
        HttpModel {
            info: info.clone(),
            meta,
        }
    }

    /// The model's metadata document (`GET /v2/models/{name}`), given its `meta`.
    pub(super) fn metadata_json(&self, meta: &ModelMeta) -> Value {
        let t = |ts: &[TensorMeta]| -> Vec<Value> {
            ts.iter()
                .map(|t| {
                    json!({"name": t.name, "datatype": t.datatype.kserve_name(), "shape": t.shape})
                })
                .collect()
        };
        json!({
            "name": self.info.name,
            "versions": ["1"],
            "platform": "fermata",
            "inputs": t(&meta.inputs),
            "outputs": t(&meta.outputs),
        })
    }

    /// The model's metadata, or why it is bad.
    pub(in crate::node) fn meta(&self) -> Result<&ModelMeta, String> {
        self.meta
            .as_ref()
            .map_err(|e| format!("model `{}` has bad metadata: {e}", self.info.name))
    }
}
