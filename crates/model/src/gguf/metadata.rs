//! GGUF metadata values.

/// One metadata value, typed as in the file (GGUF value types 0..=12).
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7.
    Bool(bool),
    /// Type 8: UTF-8 text.
    String(String),
    /// Type 9: elements of one type (possibly arrays themselves).
    Array(Vec<MetadataValue>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl MetadataValue {
    /// The value as an unsigned integer, for any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, for any integer type whose value fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, for the float types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an array value.
    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value of a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// A short name of the value's type, for error messages (`u32`, `array of string`, ...).
    pub fn type_name(&self) -> String {
        match self {
            Self::U8(_) => "u8".into(),
            Self::I8(_) => "i8".into(),
            Self::U16(_) => "u16".into(),
            Self::I16(_) => "i16".into(),
            Self::U32(_) => "u32".into(),
            Self::I32(_) => "i32".into(),
            Self::F32(_) => "f32".into(),
            Self::Bool(_) => "bool".into(),
            Self::String(_) => "string".into(),
            Self::U64(_) => "u64".into(),
            Self::I64(_) => "i64".into(),
            Self::F64(_) => "f64".into(),
            Self::Array(a) => match a.first() {
                Some(first) => format!("array of {}", first.type_name()),
                None => "empty array".into(),
            },
        }
    }
}
