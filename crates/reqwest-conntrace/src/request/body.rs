//! The response body wrapper: counts bytes and ends the request (span,
//! connection release, report) when the body ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::error::{classify_body, error_chain_text};
use crate::request::end::{EndKind, RequestEnd};
use crate::semconv;

/// A response body that reports its end. Installed by the middleware on
/// every response; reading it is unchanged for the caller.
pub(crate) struct TracedBody<B> {
    /// `None` once handed to the request's end: a body that timed out is
    /// held until the kernel has looked at its socket (see
    /// [`RequestEnd::hold_until_kernel_answers`]).
    inner: Option<B>,
    end: RequestEnd,
}

impl<B> TracedBody<B> {
    pub(crate) fn new(inner: B, end: RequestEnd) -> Self {
        Self {
            inner: Some(inner),
            end,
        }
    }
}

impl<B> Body for TracedBody<B>
where
    B: Body<Data = Bytes> + Unpin + Send + Sync + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(&mut *inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.end.body_size += data.len() as u64;
                    if !data.is_empty() {
                        let now = std::time::Instant::now();
                        this.end.note_body_progress(now);
                        this.end.put_back.on_data(now);
                    }
                }
                if inner.is_end_stream() {
                    this.end.finish(EndKind::Complete);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let text = error_chain_text(&this.end.inner.redaction, e);
                let error_type = classify_body(e);
                this.end.fail(error_type, text);
                if error_type == semconv::ERROR_TYPE_TIMEOUT
                    && let Some(inner) = this.inner.take()
                {
                    this.end.hold_until_kernel_answers(Box::new(inner));
                }
                this.end.finish(EndKind::Failed);
            }
            Poll::Ready(None) => this.end.finish(EndKind::Complete),
            Poll::Pending => this.end.put_back.on_pending(),
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}
