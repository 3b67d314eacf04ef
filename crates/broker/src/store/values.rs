//! The values the store binds and reads on either engine: integers and
//! texts only, read back strictly.

use super::StoreError;

/// A parameter or a column's value: the store keeps integers and texts
/// only (flags are 0 or 1, times are milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Value {
    Null,
    Int(i64),
    Text(String),
}

/// What can be bound as a parameter.
pub(super) trait ToValue {
    fn to_value(&self) -> Value;
}

/// Parameters for a statement: `args![a, b]` binds `?1` to `a`, `?2` to `b`.
macro_rules! args {
    ($($v:expr),* $(,)?) => {
        &[$($crate::store::values::ToValue::to_value(&$v)),*] as &[$crate::store::values::Value]
    };
}
pub(super) use args;

impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_owned())
    }
}
impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}
impl ToValue for i64 {
    fn to_value(&self) -> Value {
        Value::Int(*self)
    }
}
impl ToValue for u32 {
    fn to_value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}
impl ToValue for usize {
    fn to_value(&self) -> Value {
        Value::Int(i64::try_from(*self).unwrap_or(i64::MAX))
    }
}
impl ToValue for bool {
    fn to_value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}
impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}
impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToValue::to_value)
    }
}

/// What a column's value can be read as; a value of another shape is an
/// error naming the column, never a guess.
pub(super) trait FromValue: Sized {
    fn from_value(value: &Value) -> Result<Self, String>;
}

impl FromValue for String {
    fn from_value(value: &Value) -> Result<Self, String> {
        match value {
            Value::Text(text) => Ok(text.clone()),
            other => Err(format!("expected a text, found {other:?}")),
        }
    }
}
impl FromValue for i64 {
    fn from_value(value: &Value) -> Result<Self, String> {
        match value {
            Value::Int(n) => Ok(*n),
            other => Err(format!("expected an integer, found {other:?}")),
        }
    }
}
impl FromValue for u32 {
    fn from_value(value: &Value) -> Result<Self, String> {
        let n = i64::from_value(value)?;
        u32::try_from(n).map_err(|_| format!("{n} is out of range"))
    }
}
impl FromValue for bool {
    fn from_value(value: &Value) -> Result<Self, String> {
        Ok(i64::from_value(value)? != 0)
    }
}
impl<T: FromValue> FromValue for Option<T> {
    fn from_value(value: &Value) -> Result<Self, String> {
        match value {
            Value::Null => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

/// One row of a result.
#[derive(Debug)]
pub(super) struct Row(pub(super) Vec<Value>);

impl Row {
    pub(super) fn get<T: FromValue>(&self, index: usize) -> Result<T, StoreError> {
        let value = self.0.get(index).ok_or(StoreError::Column {
            index,
            why: "no such column".into(),
        })?;
        T::from_value(value).map_err(|why| StoreError::Column { index, why })
    }
}
