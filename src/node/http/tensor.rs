//! Tensor data between JSON and bytes: JSON elements to little-endian bytes of a
//! datatype and back, FP16 conversions, the shape's text in messages, and the
//! binary tensor extension's header.

use super::request::budget::take_elem;
use crate::repo::{bytes_of_slot, DType};
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

/// A tensor's JSON `data`, flattened in row-major order while it is parsed.
///
/// Written by hand on the request path: parsing `data` into a `serde_json::Value`
/// first built a tree of 32-byte values and one vector per nested array before
/// any element was converted; this keeps one 16-byte [`Elem`] per element and
/// nothing else (serde_json's recursion limit still bounds the nesting). Inside
/// a request's parse each element comes from its budget
/// ([`super::request::budget`]), and an object among the elements is kept as
/// a placeholder, not as a tree.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct JsonElems {
    pub elems: Vec<Elem>,
    /// Elements that are neither numbers nor booleans, whole, for error messages.
    pub odd: Vec<Value>,
}

/// One element of a JSON `data` array, as JSON typed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Elem {
    Bool(bool),
    /// A non-negative integer.
    U(u64),
    /// A negative integer.
    I(i64),
    F(f64),
    /// `odd[k]` of its [`JsonElems`]: a string, null or object.
    Odd(u32),
}

impl Elem {
    fn as_u64(self) -> Option<u64> {
        match self {
            Elem::U(u) => Some(u),
            _ => None,
        }
    }
    fn as_i64(self) -> Option<i64> {
        match self {
            Elem::U(u) => i64::try_from(u).ok(),
            Elem::I(i) => Some(i),
            _ => None,
        }
    }
    fn as_f64(self) -> Option<f64> {
        match self {
            Elem::U(u) => Some(u as f64),
            Elem::I(i) => Some(i as f64),
            Elem::F(f) => Some(f),
            _ => None,
        }
    }
}

impl JsonElems {
    /// Element `e` as JSON, for messages.
    pub fn shown(&self, e: Elem) -> Value {
        match e {
            Elem::Bool(b) => Value::Bool(b),
            Elem::U(u) => json!(u),
            Elem::I(i) => json!(i),
            Elem::F(f) => json!(f),
            Elem::Odd(k) => self.odd.get(k as usize).cloned().unwrap_or(Value::Null),
        }
    }
    /// Element `e`'s text when it is a JSON string (borrowed, not copied).
    pub fn as_str(&self, e: Elem) -> Option<&str> {
        match e {
            Elem::Odd(k) => self.odd.get(k as usize)?.as_str(),
            _ => None,
        }
    }
    fn push_odd(&mut self, v: Value) {
        self.elems.push(Elem::Odd(self.odd.len() as u32));
        self.odd.push(v);
    }
}

impl<'de> serde::Deserialize<'de> for JsonElems {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::DeserializeSeed;
        let mut out = JsonElems::default();
        Flatten(&mut out).deserialize(d)?;
        Ok(out)
    }
}

/// Appends every element of one (possibly nested) JSON value to a [`JsonElems`].
struct Flatten<'a>(&'a mut JsonElems);

impl<'de> serde::de::DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Flatten<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of numbers or booleans")
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        take_elem()?;
        self.0.elems.push(Elem::Bool(v));
        Ok(())
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        take_elem()?;
        self.0.elems.push(Elem::U(v));
        Ok(())
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        take_elem()?;
        // serde_json hands non-negative integers to visit_u64.
        self.0.elems.push(match u64::try_from(v) {
            Ok(u) => Elem::U(u),
            Err(_) => Elem::I(v),
        });
        Ok(())
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        take_elem()?;
        self.0.elems.push(Elem::F(v));
        Ok(())
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        take_elem()?;
        self.0.push_odd(Value::String(v.to_owned()));
        Ok(())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        take_elem()?;
        self.0.push_odd(Value::Null);
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Flatten(&mut *self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        take_elem()?;
        use serde::de::IgnoredAny;
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        self.0.push_odd(Value::String("(an object)".into()));
        Ok(())
    }
}

/// Appends one element's little-endian bytes; None when it is not a `dt`
/// (the same rules as `serde_json::Value`'s `as_bool`, `as_u64`, `as_i64` and
/// `as_f64`: an integer type takes integers only, a float type any number).
pub(super) fn encode_elem(dt: DType, e: Elem, out: &mut Vec<u8>) -> Option<()> {
    match dt {
        DType::Bool => match e {
            Elem::Bool(b) => out.push(b as u8),
            _ => return None,
        },
        DType::U8 => out.push(u8::try_from(e.as_u64()?).ok()?),
        DType::U16 => out.extend_from_slice(&u16::try_from(e.as_u64()?).ok()?.to_le_bytes()),
        DType::U32 => out.extend_from_slice(&u32::try_from(e.as_u64()?).ok()?.to_le_bytes()),
        DType::U64 => out.extend_from_slice(&e.as_u64()?.to_le_bytes()),
        DType::I8 => out.extend_from_slice(&i8::try_from(e.as_i64()?).ok()?.to_le_bytes()),
        DType::I16 => out.extend_from_slice(&i16::try_from(e.as_i64()?).ok()?.to_le_bytes()),
        DType::I32 => out.extend_from_slice(&i32::try_from(e.as_i64()?).ok()?.to_le_bytes()),
        DType::I64 => out.extend_from_slice(&e.as_i64()?.to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f32_to_f16(e.as_f64()? as f32).to_le_bytes()),
        DType::BF16 => {
            out.extend_from_slice(&half::bf16::from_f64(e.as_f64()?).to_bits().to_le_bytes())
        }
        DType::F32 => out.extend_from_slice(&(e.as_f64()? as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&e.as_f64()?.to_le_bytes()),
        // Strings are kept apart from numbers (`JsonElems::odd`): the request
        // decoder encodes them (`push_bytes_slot`).
        DType::Bytes => return None,
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
            DType::U16 => json!(u16::from_le_bytes(c.try_into().expect("2 bytes"))),
            DType::U32 => json!(u32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::U64 => json!(u64::from_le_bytes(c.try_into().expect("8 bytes"))),
            DType::I8 => json!(c[0] as i8),
            DType::I16 => json!(i16::from_le_bytes(c.try_into().expect("2 bytes"))),
            DType::I32 => json!(i32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::I64 => json!(i64::from_le_bytes(c.try_into().expect("8 bytes"))),
            DType::F16 => json!(f16_to_f32(u16::from_le_bytes(
                c.try_into().expect("2 bytes")
            ))),
            DType::BF16 => json!(half::bf16::from_bits(u16::from_le_bytes(
                c.try_into().expect("2 bytes")
            ))
            .to_f32()),
            DType::F32 => json!(f32::from_le_bytes(c.try_into().expect("4 bytes"))),
            DType::F64 => json!(f64::from_le_bytes(c.try_into().expect("8 bytes"))),
            DType::Bytes => Value::String(String::from_utf8_lossy(bytes_of_slot(c)).into_owned()),
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

    /// `data` parsed straight into elements: nested arrays flatten row-major,
    /// numbers keep their JSON kind, other values are kept for messages, and the
    /// conversion rules are `serde_json::Value`'s.
    #[test]
    fn json_data_flattens_and_converts_like_values() {
        let d: JsonElems =
            serde_json::from_str(r#"[[1, -2], [3.5, true], ["x", null, {"a": 1}]]"#).unwrap();
        assert_eq!(
            d.elems,
            vec![
                Elem::U(1),
                Elem::I(-2),
                Elem::F(3.5),
                Elem::Bool(true),
                Elem::Odd(0),
                Elem::Odd(1),
                Elem::Odd(2)
            ]
        );
        // An object is not kept as a tree: a placeholder names it.
        assert_eq!(d.shown(d.elems[6]), json!("(an object)"));
        assert_eq!(d.shown(d.elems[2]), json!(3.5));
        let scalar: JsonElems = serde_json::from_str("7").unwrap();
        assert_eq!(scalar.elems, vec![Elem::U(7)]);
        // Against serde_json::Value for every datatype and a spread of elements.
        let cases = r#"[0, 1, 255, 256, -1, -129, 127, 2147483648, -2147483649,
            9223372036854775807, 18446744073709551615, -9223372036854775808,
            0.5, -0.0, 1e300, 65504.0, true, false, "1", null, [], {}]"#;
        let values: Vec<Value> = serde_json::from_str(cases).unwrap();
        for v in &values {
            let text = v.to_string();
            let d: JsonElems = serde_json::from_str(&format!("[{text}]")).unwrap();
            if matches!(v, Value::Array(_)) {
                assert!(d.elems.is_empty());
                continue;
            }
            let e = d.elems[0];
            for dt in [
                DType::Bool,
                DType::U8,
                DType::I8,
                DType::I32,
                DType::I64,
                DType::F16,
                DType::F32,
                DType::F64,
            ] {
                let mut ours = Vec::new();
                let got = encode_elem(dt, e, &mut ours).map(|()| ours);
                let want = value_bytes(dt, v);
                assert_eq!(got, want, "{text} as {dt:?}");
            }
        }
    }

    /// The conversion as it was written on `serde_json::Value`.
    fn value_bytes(dt: DType, v: &Value) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        match dt {
            DType::Bool => out.push(v.as_bool()? as u8),
            DType::U8 => out.push(u8::try_from(v.as_u64()?).ok()?),
            DType::I8 => out.extend_from_slice(&i8::try_from(v.as_i64()?).ok()?.to_le_bytes()),
            DType::I32 => out.extend_from_slice(&i32::try_from(v.as_i64()?).ok()?.to_le_bytes()),
            DType::I64 => out.extend_from_slice(&v.as_i64()?.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f32_to_f16(v.as_f64()? as f32).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(v.as_f64()? as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&v.as_f64()?.to_le_bytes()),
            other => unreachable!("the reference predates {other:?}"),
        }
        Some(out)
    }

    #[test]
    fn wider_integers_and_bfloat16_round_trip_and_refuse_what_does_not_fit() {
        let elems = |text: &str| serde_json::from_str::<JsonElems>(text).unwrap();
        for (dt, ok, bad) in [
            (DType::U16, "[0, 65535, 7]", "[65536]"),
            (DType::U32, "[0, 4294967295]", "[-1]"),
            (DType::U64, "[0, 18446744073709551615]", "[-1]"),
            (DType::I16, "[-32768, 32767]", "[40000]"),
        ] {
            let v = elems(ok);
            let mut b = Vec::new();
            for &e in &v.elems {
                encode_elem(dt, e, &mut b).unwrap_or_else(|| panic!("{dt:?} {ok}"));
            }
            assert_eq!(b.len(), v.elems.len() * dt.size());
            let back = Value::Array(decode_elems(dt, &b));
            assert_eq!(back, serde_json::from_str::<Value>(ok).unwrap(), "{dt:?}");
            let e = elems(bad).elems[0];
            assert!(
                encode_elem(dt, e, &mut Vec::new()).is_none(),
                "{dt:?} {bad}"
            );
        }
        // BF16 keeps 8 bits of mantissa: 1.5 and -2.0 exactly, 0.1 nearly.
        let mut b = Vec::new();
        for &e in &elems("[1.5, -2.0, 0.1]").elems {
            encode_elem(DType::BF16, e, &mut b).unwrap();
        }
        assert_eq!(&b[..2], &0x3fc0u16.to_le_bytes());
        let back = decode_elems(DType::BF16, &b);
        assert_eq!(back[0], json!(1.5));
        assert_eq!(back[1], json!(-2.0));
        assert!((back[2].as_f64().unwrap() - 0.1).abs() < 1e-3);
    }

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
