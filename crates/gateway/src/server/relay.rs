//! The way back: the upstream's answer streamed to the agent chunk by
//! chunk, its usage read on the way, and when it ends (or is cut off) the
//! tokens it used settled against the budgets and one audit line written.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;

use super::{AuditLine, BoxError, Gateway, GatewayBody, TeamMeter, now_ms};
use crate::api::{self, Api, Call};
use crate::ledger::Slot;
use crate::usage::{Framing, Reading, Usage, UsageTap};

/// A request the gateway answers itself, with why.
pub(super) struct Refused {
    pub api: Option<Api>,
    pub status: StatusCode,
    pub reason: String,
    /// Who refused: the gateway, a budget, the upstream out of reach.
    pub kind: crate::problems::ErrorKind,
}

/// The answer's status and headers, and its body streamed through.
pub(super) fn relay(answer: reqwest::Response, record: Record) -> Response<GatewayBody> {
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !api::is_dropped_header(name.as_str()) {
            response = response.header(name, value);
        }
    }
    let stream = Tapped {
        inner: Box::pin(answer.bytes_stream()),
        record: Some(record),
    };
    let body = BodyExt::boxed_unsync(StreamBody::new(stream));
    response
        .body(body)
        .unwrap_or_else(|_| error_response(None, StatusCode::BAD_GATEWAY, "bad upstream headers"))
}

/// How the answer's body can be read: an encoded one (compressed despite
/// the request's `identity`) cannot.
pub(super) fn framing_of(headers: &reqwest::header::HeaderMap) -> Framing {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let encoded = header(reqwest::header::CONTENT_ENCODING)
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"));
    let event_stream =
        header(reqwest::header::CONTENT_TYPE).is_some_and(|v| v.contains("text/event-stream"));
    if encoded {
        Framing::Encoded
    } else if event_stream {
        Framing::EventStream
    } else {
        Framing::Json
    }
}

pub(super) fn error_response(
    api: Option<Api>,
    status: StatusCode,
    reason: &str,
) -> Response<GatewayBody> {
    let body = match api {
        Some(api) => api.error_body(status.as_u16(), reason),
        None => serde_json::json!({"error": {"message": reason}}),
    };
    let bytes = Bytes::from(body.to_string());
    let mut response = Response::new(
        Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A forwarded request's record, made when its answer has streamed
/// through (or was cut off: the client went away, the upstream broke).
pub(super) struct Record {
    pub gateway: Arc<Gateway>,
    pub agent: String,
    pub api: Api,
    pub call: Call,
    pub model: Option<String>,
    pub status: u16,
    pub start: Instant,
    pub latency_ms: u128,
    pub tap: Option<UsageTap>,
    pub slot: Option<Slot>,
    /// Released after the usage is recorded (with the record).
    pub team_hold: Option<TeamHold>,
}

/// How an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Whole,
    Broken,
    CutOff,
}

impl Record {
    fn finish(&mut self, end: End) {
        let (Some(tap), Some(slot)) = (self.tap.take(), self.slot.take()) else {
            return;
        };
        let reading = tap.finish();
        // What it used: the usage the answer said, all of it; a count
        // call, nothing; anything else its reservation, the worst case.
        let (usage, counted, reason) = match (self.call, end, reading) {
            (Call::CountTokens, _, reading) => (partial_of(reading), 0, ""),
            (Call::Generate, End::Whole, Reading::Whole(usage)) => {
                let total = usage.total();
                (usage, total, "")
            }
            (Call::Generate, end, reading) => {
                let usage = partial_of(reading);
                let counted = slot.reserved().max(usage.total());
                let reason = match end {
                    End::Whole => {
                        "the answer's usage could not be read: counted at the request's maximum"
                    }
                    End::Broken => {
                        "the upstream's answer broke off: counted at the request's maximum"
                    }
                    End::CutOff => "the answer was cut off: counted at the request's maximum",
                };
                (usage, counted, reason)
            }
        };
        slot.settle(counted);
        let recorded = Usage {
            input_tokens: usage.input_tokens.min(counted),
            output_tokens: counted.saturating_sub(usage.input_tokens.min(counted)),
            model: usage.model.clone(),
        };
        if let Some(sink) = &self.gateway.sink {
            sink.record(&self.agent, self.api, &recorded);
        }
        // Recorded: the team's reservation can go.
        drop(self.team_hold.take());
        let model = usage.model.as_deref().or(self.model.as_deref());
        self.gateway.audit(&AuditLine {
            ts_ms: now_ms(),
            agent: &self.agent,
            api: Some(self.api),
            model,
            decision: "forwarded",
            status: self.status,
            reason,
            latency_ms: self.latency_ms,
            duration_ms: self.start.elapsed().as_millis(),
            input_tokens: recorded.input_tokens,
            output_tokens: recorded.output_tokens,
        });
    }
}

fn partial_of(reading: Reading) -> Usage {
    match reading {
        Reading::Whole(usage) | Reading::Partial(usage) => usage,
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.finish(End::CutOff);
    }
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// The upstream's body, each chunk passed on as it comes and read for
/// its token counts on the way.
struct Tapped {
    inner: ByteStream,
    record: Option<Record>,
}

impl Stream for Tapped {
    type Item = Result<Frame<Bytes>, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(tap) = self.record.as_mut().and_then(|r| r.tap.as_mut()) {
                    tap.feed(&chunk);
                }
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(mut record) = self.record.take() {
                    record.finish(End::Broken);
                }
                Poll::Ready(Some(Err(Box::new(e.without_url()))))
            }
            Poll::Ready(None) => {
                if let Some(mut record) = self.record.take() {
                    record.finish(End::Whole);
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A request's tokens reserved from the team's day across daemons: given
/// back when the request has ended (after its usage was recorded).
pub(super) struct TeamHold {
    pub meter: Arc<dyn TeamMeter>,
    pub id: String,
}

impl Drop for TeamHold {
    fn drop(&mut self) {
        self.meter.release(&self.id);
    }
}

/// A request sent on whose answer has not come: if it never comes (the
/// upstream failed after the request left, or the agent went away while
/// it waited), its reservation is recorded as used, with an audit line,
/// as the agent's ledger already counts it (`tokens`: 0 when nothing
/// was used).
pub(super) struct Unanswered {
    pub gateway: Arc<Gateway>,
    pub agent: String,
    pub api: Api,
    pub tokens: u64,
    pub start: Instant,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.tokens == 0 {
            return;
        }
        let spent = crate::Usage {
            output_tokens: self.tokens,
            ..crate::Usage::default()
        };
        if let Some(sink) = &self.gateway.sink {
            sink.record(&self.agent, self.api, &spent);
        }
        self.gateway.audit(&AuditLine {
            ts_ms: now_ms(),
            agent: &self.agent,
            api: Some(self.api),
            model: None,
            decision: "forwarded",
            status: 0,
            reason: "no answer came: counted at the request's maximum",
            latency_ms: self.start.elapsed().as_millis(),
            duration_ms: self.start.elapsed().as_millis(),
            input_tokens: 0,
            output_tokens: self.tokens,
        });
    }
}
