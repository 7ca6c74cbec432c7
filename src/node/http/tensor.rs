//! Tensor data between JSON and bytes: JSON elements to little-endian bytes of a
//! datatype and back, FP16 conversions, the shape's text in messages, and the
//! binary tensor extension's header.

use crate::repo::DType;
use serde_json::{json, Value};

/// The binary tensor extension's header: the length of the JSON part of a body.
pub const HEADER_LEN: &str = "inference-header-content-length";

/// A shape as messages write it: `[1, 2, 3]`.
pub(super) fn shape_text(s: &[i64]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Nested arrays flattened in row-major order.
pub(super) fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| flatten(x, out)),
        x => out.push(x),
    }
}

/// Appends one element's little-endian bytes; None when it is not a `dt`.
pub(super) fn encode_elem(dt: DType, v: &Value, out: &mut Vec<u8>) -> Option<()> {
    match dt {
        DType::Bool => out.push(v.as_bool()? as u8),
        DType::U8 => out.push(u8::try_from(v.as_u64()?).ok()?),
        DType::I8 => out.extend_from_slice(&i8::try_from(v.as_i64()?).ok()?.to_le_bytes()),
        DType::I32 => out.extend_from_slice(&i32::try_from(v.as_i64()?).ok()?.to_le_bytes()),
        DType::I64 => out.extend_from_slice(&v.as_i64()?.to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f32_to_f16(v.as_f64()? as f32).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&(v.as_f64()? as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&v.as_f64()?.to_le_bytes()),
    }
    Some(())
}

/// A tensor's elements (little-endian bytes of `dt`) as JSON values.
pub fn decode_elems(dt: DType, b: &[u8]) -> Vec<Value> {
    let n = dt.size();
    b.chunks_exact(n)
        .map(|c| match dt {
            DType::Bool => Value::Bool(c[0] != 0),
            DType::U8 => json!(c[0]),
            DType::I8 => json!(c[0] as i8),
            DType::I32 => json!(i32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::I64 => json!(i64::from_le_bytes(c.try_into().expect("8 bytes"))),
            DType::F16 => json!(f16_to_f32(u16::from_le_bytes(
                c.try_into().expect("2 bytes")
            ))),
            DType::F32 => json!(f32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::F64 => json!(f64::from_le_bytes(c.try_into().expect("8 bytes"))),
        })
        .collect()
}

/// IEEE 754 binary32 to binary16 bits, rounding to nearest even (the `half` crate,
/// which ONNX Runtime's FP16 tensors use too).
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// IEEE 754 binary16 bits to binary32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_floats_round_trip() {
        for x in [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            6.1035156e-5,
            5.9604645e-8,
            0.333333,
        ] {
            let h = f32_to_f16(x);
            let y = f16_to_f32(h);
            assert!((x - y).abs() <= x.abs() * 1e-3, "{x} -> {h:#x} -> {y}");
        }
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert_eq!(f32_to_f16(1e-9), 0);
    }
}
