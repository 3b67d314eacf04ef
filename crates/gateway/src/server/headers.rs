//! The request headers the gateway judges before it reads the body: each
//! may come once (a second could be read upstream where the gateway read
//! the first), the body must be unencoded, and one announced over the
//! spool's limit is refused before any of it is read.

use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, TRANSFER_ENCODING};
use http::{HeaderMap, StatusCode};

/// The headers whose values the gateway judges (or that say how the body
/// it reads is framed): a request repeating one is refused.
const JUDGED: [HeaderName; 4] = [
    CONTENT_ENCODING,
    CONTENT_LENGTH,
    TRANSFER_ENCODING,
    CONTENT_TYPE,
];

/// Why the request's headers are refused: the answer's status and reason.
pub(super) fn judge(headers: &HeaderMap, max_bytes: u64) -> Result<(), (StatusCode, String)> {
    for name in &JUDGED {
        if headers.get_all(name).iter().nth(1).is_some() {
            let reason = format!("a repeated {name} header is not forwarded (send it once)");
            return Err((StatusCode::BAD_REQUEST, reason));
        }
    }
    let encoded = headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        let reason = "an encoded request body is not forwarded (send it as plain JSON)".into();
        return Err((StatusCode::UNSUPPORTED_MEDIA_TYPE, reason));
    }
    // A body announced over the limit is refused before any is read.
    let announced = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|length| length > max_bytes) {
        let error = crate::body::BodyError::TooLarge(max_bytes);
        return Err((StatusCode::PAYLOAD_TOO_LARGE, error.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, http::HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn each_judged_header_is_refused_repeated_and_encodings_but_identity() {
        assert!(judge(&headers(&[("content-encoding", "identity")]), 10).is_ok());
        assert!(judge(&headers(&[("content-type", "application/json")]), 10).is_ok());
        for name in [
            "content-encoding",
            "content-length",
            "transfer-encoding",
            "content-type",
        ] {
            let (status, reason) =
                judge(&headers(&[(name, "identity"), (name, "identity")]), 10).expect_err(name);
            assert_eq!(status, StatusCode::BAD_REQUEST, "{name}");
            assert!(reason.contains(&format!("repeated {name}")), "{reason}");
        }
        for value in ["br", "identity, gzip", "gzip"] {
            let (status, _) = judge(&headers(&[("content-encoding", value)]), 10).expect_err(value);
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{value}");
        }
        let (status, _) = judge(&headers(&[("content-length", "11")]), 10).unwrap_err();
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }
}
