//! A TCP listener whose connections a handler can kill, so a "drop" fault closes the connection
//! without writing any response (what a client sees when a load balancer resets it).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

pub struct KillableListener {
    inner: TcpListener,
    local_port: u16,
}

impl KillableListener {
    pub fn new(inner: TcpListener) -> Self {
        let local_port = inner.local_addr().map(|a| a.port()).unwrap_or(0);
        KillableListener { inner, local_port }
    }
}

/// Per-connection information handed to handlers (as `ConnectInfo<Conn>`).
#[derive(Clone, Debug)]
pub struct Conn {
    pub local_port: u16,
    killed: Arc<AtomicBool>,
}

impl Conn {
    /// Make every further read and write on this connection fail: hyper drops it unanswered.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
    }
}

pub struct KillableIo {
    inner: TcpStream,
    killed: Arc<AtomicBool>,
}

fn aborted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "connection dropped by a fault",
    )
}

impl AsyncRead for KillableIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.killed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.killed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.killed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.killed.load(Ordering::SeqCst) {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl Listener for KillableListener {
    type Io = KillableIo;
    type Addr = Conn;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, _remote)) => {
                    let _ = stream.set_nodelay(true);
                    let killed = Arc::new(AtomicBool::new(false));
                    return (
                        KillableIo {
                            inner: stream,
                            killed: killed.clone(),
                        },
                        Conn {
                            local_port: self.local_port,
                            killed,
                        },
                    );
                }
                Err(err) => {
                    tracing::debug!("emulator accept failed: {err}");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        let addr = self.inner.local_addr()?;
        Ok(Conn {
            local_port: addr.port(),
            killed: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl Connected<IncomingStream<'_, KillableListener>> for Conn {
    fn connect_info(stream: IncomingStream<'_, KillableListener>) -> Self {
        stream.remote_addr().clone()
    }
}
