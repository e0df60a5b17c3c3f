//! A strict reader of JSON request bodies.
//!
//! Request bodies are read field by field from a JSON object rather than
//! deserialized into structs, for two reasons. Errors name the field and
//! say what was expected (`temperature` must be a number), which serde's
//! messages do not do well. And every field must be consumed: whatever is
//! left at the end is rejected ([`Fields::finish`]), except an explicit
//! allow-list of fields that are safe to ignore, so a parameter the server
//! does not implement is never silently dropped.
//!
//! JSON `null` counts as absent, as in the OpenAI API and vLLM.

use serde_json::{Map, Value as Json};

use super::error::ApiError;

/// The fields of one JSON object, consumed as they are read.
#[derive(Debug)]
pub struct Fields {
    map: Map<String, Json>,
    /// Dotted path of this object in the request (`""` at the root,
    /// `"stream_options."` below it), for error messages.
    prefix: String,
}

impl Fields {
    /// Parses a request body, which must be a JSON object.
    pub fn from_body(body: &[u8]) -> Result<Self, ApiError> {
        let value: Json = serde_json::from_slice(body).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
        match value {
            Json::Object(map) => Ok(Self { map, prefix: String::new() }),
            other => Err(ApiError::InvalidJson(format!("the body must be a JSON object, got {}", type_name(&other)))),
        }
    }

    /// The fields of a nested object, errors naming `prefix.field`.
    pub fn nested(map: Map<String, Json>, prefix: &str) -> Self {
        Self { map, prefix: format!("{prefix}.") }
    }

    /// The dotted name of `field` for error messages.
    pub fn name(&self, field: &str) -> String {
        format!("{}{field}", self.prefix)
    }

    /// Removes and returns a field; `null` is absent.
    pub fn take(&mut self, field: &str) -> Option<Json> {
        match self.map.remove(field) {
            None | Some(Json::Null) => None,
            some => some,
        }
    }

    pub fn contains(&self, field: &str) -> bool {
        self.map.get(field).is_some_and(|v| !v.is_null())
    }

    pub fn f64(&mut self, field: &str) -> Result<Option<f64>, ApiError> {
        match self.take(field) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::invalid_type(self.name(field), "a number")),
        }
    }

    /// An integer (a JSON number without fraction or exponent).
    pub fn int(&mut self, field: &str) -> Result<Option<i128>, ApiError> {
        match self.take(field) {
            None => Ok(None),
            Some(v) => match as_int(&v) {
                Some(i) => Ok(Some(i)),
                // serde_json reads integers beyond 64 bits as floats.
                None if v.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() > 1e18) => {
                    Err(ApiError::invalid_value(self.name(field), format!("{v} is out of range")))
                }
                None => Err(ApiError::invalid_type(self.name(field), "an integer")),
            },
        }
    }

    pub fn bool(&mut self, field: &str) -> Result<Option<bool>, ApiError> {
        match self.take(field) {
            None => Ok(None),
            Some(Json::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(ApiError::invalid_type(self.name(field), "a boolean")),
        }
    }

    pub fn string(&mut self, field: &str) -> Result<Option<String>, ApiError> {
        match self.take(field) {
            None => Ok(None),
            Some(Json::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::invalid_type(self.name(field), "a string")),
        }
    }

    pub fn object(&mut self, field: &str) -> Result<Option<Map<String, Json>>, ApiError> {
        match self.take(field) {
            None => Ok(None),
            Some(Json::Object(m)) => Ok(Some(m)),
            Some(_) => Err(ApiError::invalid_type(self.name(field), "an object")),
        }
    }

    /// Accepts a field the server does not implement only at the value that
    /// means "off" (e.g. `frequency_penalty: 0`, `n: 1`), so that clients
    /// that always send defaults keep working; any other value is refused.
    pub fn neutral(&mut self, field: &str, is_neutral: impl Fn(&Json) -> bool, reason: &str) -> Result<(), ApiError> {
        match self.take(field) {
            Some(v) if !is_neutral(&v) => Err(ApiError::unsupported(self.name(field), reason)),
            _ => Ok(()),
        }
    }

    /// Ends the read: drops the `ignorable` fields (accepted, with no effect
    /// on generation, e.g. `user`) and rejects anything else still there,
    /// naming it. `known` lists fields of the API that this server does not
    /// implement, for a clearer message than "unknown".
    pub fn finish(self, ignorable: &[&str], known: &[&str]) -> Result<(), ApiError> {
        for (field, value) in self.map {
            if value.is_null() || ignorable.contains(&field.as_str()) {
                continue;
            }
            let param = format!("{}{field}", self.prefix);
            return Err(if known.contains(&field.as_str()) {
                ApiError::unsupported(param, "")
            } else {
                ApiError::UnknownField { param }
            });
        }
        Ok(())
    }
}

/// An integer value, if `v` is one.
pub fn as_int(v: &Json) -> Option<i128> {
    v.as_i64().map(i128::from).or_else(|| v.as_u64().map(i128::from))
}

/// JSON's name for the type of `v`, for error messages.
pub fn type_name(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_rejects_leftovers() {
        let mut f = Fields::from_body(br#"{"a": 1, "b": null, "c": "x", "user": "u", "zz": 2}"#).unwrap();
        assert_eq!(f.int("a").unwrap(), Some(1));
        assert_eq!(f.f64("b").unwrap(), None);
        assert_eq!(f.string("c").unwrap().as_deref(), Some("x"));
        let err = f.finish(&["user"], &[]).unwrap_err();
        assert_eq!(err, ApiError::UnknownField { param: "zz".into() });
    }

    #[test]
    fn type_errors_name_the_field() {
        let mut f = Fields::from_body(br#"{"t": "hot", "n": 1.5}"#).unwrap();
        assert_eq!(f.f64("t").unwrap_err(), ApiError::invalid_type("t", "a number"));
        assert_eq!(f.int("n").unwrap_err(), ApiError::invalid_type("n", "an integer"));
        assert!(Fields::from_body(b"[1]").is_err());
        assert!(Fields::from_body(b"{").is_err());
    }
}
