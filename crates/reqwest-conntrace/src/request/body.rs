//! The response body wrapper: counts bytes and ends the request (span,
//! connection release, report) when the body ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::error::{classify_body, error_chain_text};
use crate::request::attribution::{EndKind, RequestEnd};

pin_project! {
    /// A response body that reports its end. Installed by the middleware on
    /// every response; reading it is unchanged for the caller.
    pub(crate) struct TracedBody<B> {
        #[pin]
        inner: B,
        end: RequestEnd,
    }
}

impl<B> TracedBody<B> {
    pub(crate) fn new(inner: B, end: RequestEnd) -> Self {
        Self { inner, end }
    }
}

impl<B> Body for TracedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.end.body_size += data.len() as u64;
                    if !data.is_empty() {
                        this.end.body_progress_at = Some(std::time::Instant::now());
                    }
                }
                if this.inner.is_end_stream() {
                    this.end.finish(EndKind::Complete);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let text = error_chain_text(&this.end.inner.redaction, e);
                this.end.fail(classify_body(e), text);
                this.end.finish(EndKind::Failed);
            }
            Poll::Ready(None) => this.end.finish(EndKind::Complete),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
