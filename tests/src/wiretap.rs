//! A TCP proxy in front of a gateway that records what crosses it, for tests of what a
//! client puts on the wire: the upgrade request, the server's answer, the client's
//! first WebSocket frame. Everything is forwarded unchanged.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Bytes kept per direction and connection: the handshake and the first frames.
const KEPT: usize = 64 * 1024;

/// What one connection carried: the client's bytes and the server's, from the start.
#[derive(Clone, Debug, Default)]
pub struct Tapped {
    pub from_client: Vec<u8>,
    pub from_server: Vec<u8>,
}

impl Tapped {
    /// The client's request head (up to the blank line).
    pub fn request_head(&self) -> String {
        head(&self.from_client).0
    }

    /// The server's response head.
    pub fn response_head(&self) -> String {
        head(&self.from_server).0
    }

    /// The payload of the client's first WebSocket text frame after the upgrade, unmasked
    /// (`None` while it has not come whole).
    pub fn first_client_text(&self) -> Option<String> {
        let (_, at) = head(&self.from_client);
        let f = &self.from_client[at..];
        let (opcode, masked, len7) = (*f.first()? & 0x0f, *f.get(1)? & 0x80 != 0, (*f.get(1)? & 0x7f) as usize);
        let (len, mut at) = match len7 {
            126 => (u16::from_be_bytes([*f.get(2)?, *f.get(3)?]) as usize, 4),
            127 => (u64::from_be_bytes(f.get(2..10)?.try_into().ok()?) as usize, 10),
            n => (n, 2),
        };
        let mask: [u8; 4] = if masked { f.get(at..at + 4)?.try_into().ok()? } else { [0; 4] };
        at += if masked { 4 } else { 0 };
        let payload: Vec<u8> = f.get(at..at + len)?.iter().enumerate().map(|(k, b)| b ^ mask[k % 4]).collect();
        (opcode == 1).then(|| String::from_utf8_lossy(&payload).into_owned())
    }
}

/// The head of an HTTP message (before `\r\n\r\n`) and where what follows starts.
fn head(bytes: &[u8]) -> (String, usize) {
    match bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(end) => (String::from_utf8_lossy(&bytes[..end]).into_owned(), end + 4),
        None => (String::from_utf8_lossy(bytes).into_owned(), bytes.len()),
    }
}

/// The recording proxy; every connection through it is kept in [`WireTap::connections`].
pub struct WireTap {
    pub addr: SocketAddr,
    tapped: Arc<Mutex<Vec<Arc<Mutex<Tapped>>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WireTap {
    pub async fn start(upstream: SocketAddr) -> WireTap {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("tap binds");
        let addr = listener.local_addr().expect("tap address");
        let tapped: Arc<Mutex<Vec<Arc<Mutex<Tapped>>>>> = Arc::default();
        let all = tapped.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                while conns.try_join_next().is_some() {}
                let record = Arc::new(Mutex::new(Tapped::default()));
                all.lock().unwrap().push(record.clone());
                conns.spawn(forward(inbound, upstream, record));
            }
        });
        WireTap { addr, tapped, task }
    }

    /// `http://ADDR`, for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What each connection so far carried, in the order they were accepted.
    pub fn connections(&self) -> Vec<Tapped> {
        self.tapped.lock().unwrap().iter().map(|t| t.lock().unwrap().clone()).collect()
    }
}

impl Drop for WireTap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(inbound: TcpStream, upstream: SocketAddr, record: Arc<Mutex<Tapped>>) {
    let Ok(outbound) = TcpStream::connect(upstream).await else { return };
    let (cr, cw) = inbound.into_split();
    let (sr, sw) = outbound.into_split();
    let up = pump(cr, sw, record.clone(), |t| &mut t.from_client);
    let down = pump(sr, cw, record, |t| &mut t.from_server);
    let _ = tokio::join!(up, down);
}

/// Copies one direction, keeping its first [`KEPT`] bytes.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    record: Arc<Mutex<Tapped>>,
    side: fn(&mut Tapped) -> &mut Vec<u8>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        {
            let mut t = record.lock().unwrap();
            let kept = side(&mut t);
            let room = KEPT.saturating_sub(kept.len()).min(n);
            kept.extend_from_slice(&buf[..room]);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
