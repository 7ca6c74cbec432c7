//! Reads a model's initializers (its weights) out of the ONNX file, so that the
//! sessions of one model's batch-size buckets can share a single copy of them
//! (`AddInitializer`): ONNX Runtime gives each session its own copy of every
//! initializer it loads from the file, which for N buckets is N copies on the
//! device.
//!
//! Only the few protobuf fields needed are declared (prost skips the rest):
//! `ModelProto.graph`, `GraphProto.initializer` and the data fields of
//! `TensorProto` (onnx.proto3, field numbers as in the ONNX specification).

use anyhow::{bail, Context, Result};
use prost::Message;
use std::path::Path;

#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "5")]
    initializer: Vec<TensorProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(float, repeated, tag = "4")]
    float_data: Vec<f32>,
    #[prost(int32, repeated, tag = "5")]
    int32_data: Vec<i32>,
    #[prost(int64, repeated, tag = "7")]
    int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    name: String,
    #[prost(bytes = "vec", tag = "9")]
    raw_data: Vec<u8>,
    #[prost(double, repeated, tag = "10")]
    double_data: Vec<f64>,
    /// 1 = EXTERNAL (the data is in another file).
    #[prost(int32, tag = "14")]
    data_location: i32,
}

/// ONNX `TensorProto.DataType` codes of the floating-point types shared.
pub const FLOAT: i32 = 1;
pub const FLOAT16: i32 = 10;
pub const DOUBLE: i32 = 11;
pub const BFLOAT16: i32 = 16;

/// Initializers smaller than this are left to each session (a copy costs nothing
/// worth sharing, and small integer tensors are often shapes that kernels read on
/// the host).
pub const MIN_SHARED_BYTES: usize = 1024;

/// One initializer: its name, ONNX element type, dims and little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Initializer {
    pub name: String,
    pub data_type: i32,
    pub dims: Vec<i64>,
    pub bytes: Vec<u8>,
}

fn elem_size(t: i32) -> Option<usize> {
    match t {
        FLOAT => Some(4),
        FLOAT16 | BFLOAT16 => Some(2),
        DOUBLE => Some(8),
        _ => None,
    }
}

/// The floating-point initializers of the ONNX file at `path` of at least
/// [`MIN_SHARED_BYTES`], with their data, in file order. Tensors of other types,
/// smaller ones and ones stored in external files are not returned (the session
/// loads those itself). An error says why the file cannot be read.
pub fn shareable_initializers(path: &Path) -> Result<Vec<Initializer>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let m = ModelProto::decode(bytes.as_slice())
        .with_context(|| format!("{}: not an ONNX model (protobuf)", path.display()))?;
    let Some(g) = m.graph else {
        bail!("{}: the ONNX model has no graph", path.display());
    };
    let mut out = Vec::new();
    for t in g.initializer {
        let Some(es) = elem_size(t.data_type) else {
            continue;
        };
        if t.data_location == 1 || t.dims.iter().any(|&d| d < 0) {
            continue;
        }
        let n: usize = t.dims.iter().map(|&d| d as usize).product();
        let data = if !t.raw_data.is_empty() {
            t.raw_data
        } else {
            match t.data_type {
                FLOAT => t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DOUBLE => t.double_data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                // FLOAT16 and BFLOAT16 sit in int32_data, one value in the low 16 bits.
                _ => t
                    .int32_data
                    .iter()
                    .flat_map(|v| (*v as u16).to_le_bytes())
                    .collect(),
            }
        };
        if data.len() != n * es {
            bail!(
                "{}: initializer `{}` has {} bytes of data but its dims {:?} make {}",
                path.display(),
                t.name,
                data.len(),
                t.dims,
                n * es
            );
        }
        if data.len() < MIN_SHARED_BYTES {
            continue;
        }
        out.push(Initializer {
            name: t.name,
            data_type: t.data_type,
            dims: t.dims,
            bytes: data,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_shipped_mlp_weights() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/mlp.onnx");
        let inits = shareable_initializers(&p).unwrap();
        // fc0 64->128, fc1 128->128, fc2 128->10 weights; biases are < 1 KiB.
        let names: Vec<&str> = inits.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["fc0.weight", "fc1.weight", "fc2.weight"]);
        assert_eq!(inits[0].dims, [128, 64]);
        assert_eq!(inits[0].bytes.len(), 128 * 64 * 4);
        assert!(inits.iter().all(|i| i.data_type == FLOAT));
        // Real weights, not zeros.
        assert!(inits[1].bytes.iter().any(|&b| b != 0));
    }

    #[test]
    fn float_data_and_bad_files() {
        let t = TensorProto {
            dims: vec![16, 16],
            data_type: FLOAT,
            float_data: (0..256).map(|i| i as f32).collect(),
            name: "w".into(),
            ..Default::default()
        };
        let small = TensorProto {
            dims: vec![2],
            data_type: FLOAT,
            float_data: vec![1.0, 2.0],
            name: "b".into(),
            ..Default::default()
        };
        let m = ModelProto {
            graph: Some(GraphProto {
                initializer: vec![t, small],
            }),
        };
        let dir = std::env::temp_dir().join(format!("fermata-proto-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.onnx");
        std::fs::write(&p, m.encode_to_vec()).unwrap();
        let inits = shareable_initializers(&p).unwrap();
        assert_eq!(inits.len(), 1);
        assert_eq!(&inits[0].bytes[4..8], &1.0f32.to_le_bytes());
        std::fs::write(&p, b"\xff\xff\xff not protobuf").unwrap();
        let e = shareable_initializers(&p).unwrap_err();
        assert!(format!("{e:#}").contains("not an ONNX model"), "{e:#}");
        let bad = ModelProto {
            graph: Some(GraphProto {
                initializer: vec![TensorProto {
                    dims: vec![1024],
                    data_type: FLOAT,
                    raw_data: vec![0; 12],
                    name: "short".into(),
                    ..Default::default()
                }],
            }),
        };
        std::fs::write(&p, bad.encode_to_vec()).unwrap();
        let e = shareable_initializers(&p).unwrap_err();
        assert!(format!("{e:#}").contains("`short`"), "{e:#}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
