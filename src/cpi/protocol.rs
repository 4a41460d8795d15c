//! The BOSH CPI JSON protocol: one request on stdin, one response on stdout.
//!
//! Request: `{"method", "arguments": [...], "context": {...}, "api_version"}`.
//! Response: `{"result", "error": null | {"type", "message", "ok_to_retry"}, "log"}`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The largest request we accept on stdin; CPI requests are small (a path and properties).
pub const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: String,
    pub arguments: Vec<Value>,
    pub context: Map<String, Value>,
    pub api_version: Option<u64>,
}

/// CPI error types bosh understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    CloudError,
    NotImplemented,
    StemcellNotFound,
    InvalidCall,
}

impl ErrorType {
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorType::CloudError => "Bosh::Clouds::CloudError",
            ErrorType::NotImplemented => "Bosh::Clouds::NotImplemented",
            ErrorType::StemcellNotFound => "Bosh::Clouds::StemcellNotFound",
            ErrorType::InvalidCall => "InvalidCall",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CpiError {
    pub kind: ErrorType,
    pub message: String,
    pub ok_to_retry: bool,
}

impl CpiError {
    pub fn new(kind: ErrorType, message: impl Into<String>, ok_to_retry: bool) -> Self {
        Self {
            kind,
            message: message.into(),
            ok_to_retry,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorType::InvalidCall, message, false)
    }
}

/// The `ok_to_retry` a failure is answered with: a typed cause of a retryable class (the
/// classes `wiring::failure` reads), or a CPI error in the chain that says so itself; never when
/// some cause is a refused TLS certificate. A CPI error is the CPI's answer, built from a chain
/// ([`super::handler::cloud_error`]); when a caller puts one in a chain as context, the CPI
/// reads it here, as the application floor knows no front end.
pub fn is_transient(err: &anyhow::Error) -> bool {
    crate::wiring::failure::is_transient(err)
        || (!crate::wiring::failure::refuses_a_certificate(err)
            && err
                .chain()
                .filter_map(|c| c.downcast_ref::<CpiError>())
                .any(|e| e.ok_to_retry))
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    pub ok_to_retry: bool,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Response {
    pub result: Value,
    pub error: Option<ErrorBody>,
    pub log: String,
}

impl Response {
    pub fn ok(result: Value, log: String) -> Self {
        Self {
            result,
            error: None,
            log,
        }
    }

    pub fn err(e: &CpiError, log: String) -> Self {
        Self {
            result: Value::Null,
            error: Some(ErrorBody {
                kind: e.kind.as_str().to_string(),
                message: e.message.clone(),
                ok_to_retry: e.ok_to_retry,
            }),
            log,
        }
    }
}

/// Parse a request; every malformation is an `InvalidCall` naming what is wrong.
pub fn parse_request(bytes: &[u8]) -> Result<Request, CpiError> {
    if bytes.len() > MAX_REQUEST_BYTES {
        return Err(CpiError::invalid(format!(
            "request is {} bytes, more than the {MAX_REQUEST_BYTES} a CPI request may have",
            bytes.len()
        )));
    }
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| CpiError::invalid(format!("request is not valid JSON: {e}")))?;
    let Value::Object(mut o) = v else {
        return Err(CpiError::invalid(
            "request must be a JSON object with method, arguments and context",
        ));
    };
    let method = match o.remove("method") {
        Some(Value::String(s)) if !s.is_empty() => s,
        Some(_) => {
            return Err(CpiError::invalid(
                "request field `method` must be a non-empty string",
            ))
        }
        None => return Err(CpiError::invalid("request has no `method`")),
    };
    let arguments = match o.remove("arguments") {
        Some(Value::Array(a)) => a,
        None | Some(Value::Null) => Vec::new(),
        Some(_) => {
            return Err(CpiError::invalid(
                "request field `arguments` must be an array",
            ))
        }
    };
    let context = match o.remove("context") {
        Some(Value::Object(m)) => m,
        None | Some(Value::Null) => Map::new(),
        Some(_) => {
            return Err(CpiError::invalid(
                "request field `context` must be an object",
            ))
        }
    };
    let api_version = match o.remove("api_version") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.as_u64().ok_or_else(|| {
            CpiError::invalid("request field `api_version` must be a positive integer")
        })?),
        Some(_) => {
            return Err(CpiError::invalid(
                "request field `api_version` must be an integer",
            ))
        }
    };
    Ok(Request {
        method,
        arguments,
        context,
        api_version,
    })
}

/// Typed access to positional arguments, with protocol errors naming the argument.
pub fn arg_str<'a>(req: &'a Request, index: usize, name: &str) -> Result<&'a str, CpiError> {
    match req.arguments.get(index) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(other) => Err(CpiError::invalid(format!(
            "{}: argument {} ({name}) must be a non-empty string, got {}",
            req.method,
            index + 1,
            kind_of(other)
        ))),
        None => Err(CpiError::invalid(format!(
            "{}: argument {} ({name}) is missing",
            req.method,
            index + 1
        ))),
    }
}

pub fn arg_object<'a>(
    req: &'a Request,
    index: usize,
    name: &str,
) -> Result<&'a Map<String, Value>, CpiError> {
    match req.arguments.get(index) {
        Some(Value::Object(m)) => Ok(m),
        Some(other) => Err(CpiError::invalid(format!(
            "{}: argument {} ({name}) must be an object, got {}",
            req.method,
            index + 1,
            kind_of(other)
        ))),
        None => Err(CpiError::invalid(format!(
            "{}: argument {} ({name}) is missing",
            req.method,
            index + 1
        ))),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_director_request() {
        let r = parse_request(
            br#"{"method":"create_stemcell","arguments":["/tmp/image",{"name":"x"}],"context":{"director_uuid":"d","request_id":"cpi-1"},"api_version":2}"#,
        )
        .unwrap();
        assert_eq!(r.method, "create_stemcell");
        assert_eq!(arg_str(&r, 0, "image_path").unwrap(), "/tmp/image");
        assert_eq!(arg_object(&r, 1, "cloud_properties").unwrap()["name"], "x");
        assert_eq!(r.api_version, Some(2));
    }

    #[test]
    fn malformed_requests_are_invalid_calls_naming_the_problem() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "not valid JSON"),
            (b"{", "not valid JSON"),
            (b"[]", "JSON object"),
            (br#"{"arguments":[]}"#, "no `method`"),
            (br#"{"method":5}"#, "`method`"),
            (
                br#"{"method":"info","arguments":{}}"#,
                "`arguments` must be an array",
            ),
            (
                br#"{"method":"info","context":[]}"#,
                "`context` must be an object",
            ),
            (br#"{"method":"info","api_version":"2"}"#, "`api_version`"),
        ];
        for (input, want) in cases {
            let e = parse_request(input).unwrap_err();
            assert_eq!(e.kind, ErrorType::InvalidCall);
            assert!(
                e.message.contains(want),
                "{:?}: {}",
                String::from_utf8_lossy(input),
                e.message
            );
        }
    }

    #[test]
    fn wrong_argument_types_name_the_argument() {
        let r = parse_request(br#"{"method":"create_stemcell","arguments":[5, "x"]}"#).unwrap();
        let e = arg_str(&r, 0, "image_path").unwrap_err();
        assert!(
            e.message.contains("image_path") && e.message.contains("a number"),
            "{}",
            e.message
        );
        let e = arg_object(&r, 1, "cloud_properties").unwrap_err();
        assert!(e.message.contains("cloud_properties"), "{}", e.message);
        let e = arg_str(&r, 2, "third").unwrap_err();
        assert!(e.message.contains("missing"), "{}", e.message);
    }

    #[test]
    fn response_shape_is_what_bosh_reads() {
        let r = Response::err(
            &CpiError::new(ErrorType::StemcellNotFound, "gone", false),
            "l".into(),
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["error"]["type"], "Bosh::Clouds::StemcellNotFound");
        assert_eq!(v["error"]["ok_to_retry"], false);
        assert_eq!(v["result"], Value::Null);
        assert_eq!(v["log"], "l");
    }

    #[test]
    fn a_transient_lock_error_is_worth_retrying_and_a_certificate_failure_never() {
        let cpi = CpiError::new(ErrorType::CloudError, "busy", true);
        assert!(is_transient(&anyhow::Error::new(cpi)));
        let cert = CpiError::new(
            ErrorType::CloudError,
            "invalid peer certificate: UnknownIssuer",
            true,
        );
        assert!(!is_transient(&anyhow::Error::new(cert)));
    }

    #[test]
    fn a_refused_certificate_is_exit_1_and_never_transient_whatever_wraps_it() {
        use crate::error::Exit;
        use crate::wiring::failure::exit_for;
        let url = url::Url::parse("https://login.example/tenant").unwrap();
        let cert =
            crate::error::UntrustedCertificate::new(&url, rustls::CertificateError::UnknownIssuer);
        // Under a layer that would otherwise be worth retrying (a transient lock error).
        let err = anyhow::Error::new(cert).context(CpiError::new(
            ErrorType::CloudError,
            "delete_stemcell",
            true,
        ));
        assert!(!is_transient(&err));
        assert_eq!(exit_for(&err), Exit::Error);
    }
}
