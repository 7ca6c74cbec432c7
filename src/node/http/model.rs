//! A model as the HTTP API shows it ([`HttpModel`]): its tensors (from its
//! metadata, or synthesized for emulated, profile-only models) and its KServe v2
//! metadata document.

use crate::node::apps::ServedApp;
use crate::node::exec::max_batch_of;
use crate::repo::{DType, ModelMeta, TensorMeta};
use crate::wire::ModelInfo;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// The models an API serves, by index and by name (the HTTP and gRPC APIs').
pub(in crate::node) struct Models {
    list: Vec<HttpModel>,
    by_name: HashMap<String, usize>,
}

impl Models {
    /// The models `infos`, then the applications `apps`.
    pub(in crate::node) fn new(infos: &[ModelInfo], apps: &[Arc<ServedApp>]) -> Models {
        let mut list: Vec<HttpModel> = infos.iter().map(HttpModel::new).collect();
        list.extend(apps.iter().map(|a| HttpModel {
            info: a.info(),
            meta: Ok(a.meta.clone()),
            app: Some(a.clone()),
        }));
        let by_name = list
            .iter()
            .enumerate()
            .map(|(i, m)| (m.info.name.clone(), i))
            .collect();
        Models { list, by_name }
    }

    /// Model `name`'s index, or the error that lists what is served.
    pub(in crate::node) fn index(&self, name: &str) -> Result<usize, String> {
        self.by_name.get(name).copied().ok_or_else(|| {
            let served: Vec<&str> = self.list.iter().map(|m| m.info.name.as_str()).collect();
            format!("unknown model `{name}` (served: {})", served.join(", "))
        })
    }

    /// Whether model `name` has `version` (the one there is, "1"; empty: the
    /// latest); the error says which it has.
    pub(in crate::node) fn version(name: &str, version: &str) -> Result<(), String> {
        if version.is_empty() || version == "1" {
            Ok(())
        } else {
            Err(format!(
                "model `{name}` has no version `{version}` (its versions: 1)"
            ))
        }
    }
}

impl std::ops::Deref for Models {
    type Target = [HttpModel];
    fn deref(&self) -> &[HttpModel] {
        &self.list
    }
}

/// A model as the HTTP API shows it.
pub(in crate::node) struct HttpModel {
    pub(in crate::node) info: ModelInfo,
    /// Its tensors (synthesized for emulated models), or why its metadata is bad.
    pub(in crate::node) meta: Result<ModelMeta, String>,
    /// The application, when this is one (an ensemble over the models).
    pub(in crate::node) app: Option<Arc<ServedApp>>,
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
                max_batch: max_batch_of(info),
                description: "emulated (profile only)".into(),
                batch_buckets: None,
            }),
        };
        HttpModel {
            info: info.clone(),
            meta,
            app: None,
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
            // The same name as the model's configuration gives.
            "platform": match self.app {
                Some(_) => "ensemble",
                None => super::triton::platform(self.info.meta().is_none()).0,
            },
            "inputs": t(&meta.inputs),
            "outputs": t(&meta.outputs),
        })
    }

    /// Its statistics: the frontend's of model `i`, or the application's.
    pub(in crate::node) fn stats<'a>(
        &'a self,
        fe: &'a crate::node::frontend::FrontendHandle,
        i: usize,
    ) -> Option<&'a crate::node::frontend::stats::ModelStats> {
        match &self.app {
            Some(a) => Some(&a.stats),
            None => fe.stats(i),
        }
    }

    /// The model's metadata, or why it is bad.
    pub(in crate::node) fn meta(&self) -> Result<&ModelMeta, String> {
        self.meta
            .as_ref()
            .map_err(|e| format!("model `{}` has bad metadata: {e}", self.info.name))
    }
}
