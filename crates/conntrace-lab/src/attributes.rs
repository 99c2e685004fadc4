//! `Attributes`: typed look-ups over a list of OTLP key-values.

use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};

/// A list of OTLP attributes (span, event, link, resource or data point)
/// with typed accessors. Look-ups return the first entry with the key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attributes(Vec<KeyValue>);

impl Attributes {
    /// Wraps a decoded attribute list.
    pub fn new(kvs: Vec<KeyValue>) -> Self {
        Self(kvs)
    }

    /// The raw key-values.
    pub fn as_slice(&self) -> &[KeyValue] {
        &self.0
    }

    /// Number of attributes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no attributes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// All keys, in order.
    pub fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|kv| kv.key.as_str()).collect()
    }

    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    /// Whether `key` is present (with any value).
    pub fn has(&self, key: &str) -> bool {
        self.0.iter().any(|kv| kv.key == key)
    }

    /// The string value of `key`; `None` if absent or not a string.
    pub fn str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            Value::StringValue(s) => Some(s),
            _ => None,
        }
    }

    /// The integer value of `key`; `None` if absent or not an integer.
    pub fn i64(&self, key: &str) -> Option<i64> {
        match self.get(key)? {
            Value::IntValue(i) => Some(*i),
            _ => None,
        }
    }

    /// The value of `key` as a float: doubles as they are, integers
    /// converted; `None` if absent or of another type.
    pub fn f64(&self, key: &str) -> Option<f64> {
        match self.get(key)? {
            Value::DoubleValue(d) => Some(*d),
            Value::IntValue(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The boolean value of `key`; `None` if absent or not a boolean.
    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::BoolValue(b) => Some(*b),
            _ => None,
        }
    }

    /// The string elements of an array value; `None` if absent or not an
    /// array. Non-string elements are skipped.
    pub fn str_array(&self, key: &str) -> Option<Vec<String>> {
        match self.get(key)? {
            Value::ArrayValue(array) => Some(
                array
                    .values
                    .iter()
                    .filter_map(|v| match &v.value {
                        Some(Value::StringValue(s)) => Some(s.clone()),
                        _ => None,
                    })
                    .collect(),
            ),
            _ => None,
        }
    }

    /// The value of `key` rendered as text (strings unquoted, arrays as
    /// `[a, b]`), for messages and tables; `None` if absent.
    pub fn display(&self, key: &str) -> Option<String> {
        self.get(key).map(render)
    }
}

fn render(value: &Value) -> String {
    match value {
        Value::StringValue(s) => s.clone(),
        Value::BoolValue(b) => b.to_string(),
        Value::IntValue(i) => i.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        Value::ArrayValue(a) => {
            let items: Vec<String> = a.values.iter().map(render_any).collect();
            format!("[{}]", items.join(", "))
        }
        Value::KvlistValue(list) => {
            let items: Vec<String> = list
                .values
                .iter()
                .map(|kv| {
                    let v = kv.value.as_ref().map(render_any).unwrap_or_default();
                    format!("{}={v}", kv.key)
                })
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::BytesValue(b) => crate::received_span::hex(b),
        Value::StringValueStrindex(i) => format!("strindex:{i}"),
    }
}

fn render_any(value: &AnyValue) -> String {
    value.value.as_ref().map(render).unwrap_or_default()
}
