//! A VM's serial console over the agents' HTTPS API: `GET
//! /v1/vms/{name}/console`, upgraded to a WebSocket, on the agent that
//! runs the VM's live side (its primary, or the VM itself if unprotected).
//! The agent attaches to the VM's console through its control socket as
//! `ftvm console` does (`ftvm_api::client::attach_console`: the VM decides
//! who types, replays its recent output first) and relays: the VM's
//! output as binary messages, what the client sends typed on the console.
//! The first message is a text one, [`Attached`]: which VM, on which host,
//! and whether this client types. A client's close is a detach: the VM
//! frees the typist's place before the close is answered, so a client may
//! attach again at once. The VM's end closing (it stopped, handed over,
//! failed over) closes the WebSocket with [`VM_CLOSED`].
//!
//! A WebSocket, not a pair of HTTP requests (a stream of output, a POST
//! per keystroke) or a raw upgrade of our own: one connection carries both
//! ways, a browser speaks it (the dashboard's console: its WebSocket
//! carries the page's session cookie, which an EventSource's POSTs would
//! need too), and axum and tungstenite implement it, limits and all.
//!
//! Outside input never hurts the agent or the VM: messages are at most
//! [`MAX_MESSAGE`] bytes; what a client types reaches the VM at most at
//! [`TYPED_PER_SECOND`] (after a burst), since the VM queues typed bytes
//! until its guest reads them; a client that does not read what is sent
//! for [`SEND_WITHIN`] is let go; at most [`SESSIONS`] consoles are open
//! on an agent at once.
//!
//! Here too the client ([`open`], [`open_blocking`]): `ftvm cluster vm
//! console` finds the VM's live side in the hosts' records and connects
//! there; the dashboard relays a browser to it ([`relay`]).

use crate::authority::credentials::Credentials;
use crate::model::{ApiError, HostRecord, Role};
use axum::extract::ws::{self, WebSocket, WebSocketUpgrade};
use futures_util::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, protocol::WebSocketConfig};
use tokio_tungstenite::WebSocketStream;

/// The largest message either side may send: a paste, a burst of output.
pub const MAX_MESSAGE: usize = 64 << 10;
/// How long a send may wait on a client that does not read.
pub const SEND_WITHIN: Duration = Duration::from_secs(30);
/// How many consoles an agent serves at once.
pub const SESSIONS: usize = 32;
/// Typed bytes a second a client's keys reach the VM at, after a burst
/// of [`TYPED_BURST`] (a person types tens a second; a paste is a burst).
pub const TYPED_PER_SECOND: usize = 32 << 10;
pub const TYPED_BURST: usize = 128 << 10;
/// The close's reason when the VM's end of its console closed.
pub const VM_CLOSED: &str = "the VM's console closed";
/// How long the VM has to let go of a detaching client.
const LET_GO_WITHIN: Duration = Duration::from_secs(5);
/// How long a VM or an agent has to answer an attach.
const ATTACH_WITHIN: Duration = Duration::from_secs(10);
/// How long an agent's host has to accept the connection (a dead host's
/// record names it for a lease's time after a failover: the next host
/// is tried after this).
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// The first message of a console: what it is attached to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attached {
    pub vm: String,
    /// The host whose agent serves it (the VM's live side runs there).
    pub host: String,
    /// Whether this client types (else it watches).
    pub typing: bool,
}

/// The console route's query.
#[derive(Debug, serde::Deserialize)]
pub struct ConsoleQuery {
    /// Watch only: never take the typist's place.
    pub read_only: Option<bool>,
}

/// Why a client could not open a VM's console.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("no VM {0} in the cluster")]
    NoVm(String),
    #[error("VM {vm} has no live side now to attach to ({sides})")]
    NoLiveSide { vm: String, sides: String },
    /// The agent refused, with its reason.
    #[error("{0}")]
    Api(ApiError),
    #[error("cannot reach the agent at {url}: {problem}")]
    Transport { url: String, problem: String },
    #[error("the agent at {url} did not answer as a console: {problem}")]
    Protocol { url: String, problem: String },
    #[error("{0}")]
    Credentials(#[from] crate::authority::credentials::CredentialsError),
}

/// The WebSocket upgrade with this module's limits.
pub fn limits(ws: WebSocketUpgrade) -> WebSocketUpgrade {
    ws.max_message_size(MAX_MESSAGE).max_frame_size(MAX_MESSAGE).max_write_buffer_size(4 * MAX_MESSAGE)
}

/// Attaches to the console of the VM whose control socket is `socket`
/// (on the blocking pool, within [`ATTACH_WITHIN`]): the connection and
/// whether it types. The VM's refusal (another client types, a backup
/// that has not gone live) is a conflict.
pub async fn attach_local(socket: PathBuf, read_only: bool) -> Result<(tokio::net::UnixStream, bool), ApiError> {
    use ftvm_api::client::ControlSocketError as E;
    let attached = tokio::task::spawn_blocking(move || {
        ftvm_api::client::attach_console_within(&socket, read_only, Some(ATTACH_WITHIN))
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the attach's thread failed: {e}")))?;
    let (conn, typing) = match attached {
        Ok(a) => a,
        Err(E::Refused(ftvm_api::ControlError::Console(why))) => return Err(ApiError::Conflict(why)),
        Err(E::Refused(other)) => return Err(ApiError::Refused(other.to_string())),
        Err(e) => return Err(ApiError::Unavailable(e.to_string())),
    };
    let local = |e: std::io::Error| ApiError::Internal(format!("the console's connection: {e}"));
    conn.set_nonblocking(true).map_err(local)?;
    Ok((tokio::net::UnixStream::from_std(conn).map_err(local)?, typing))
}

/// What a client may type now: a token bucket, so that a flood waits
/// (its socket unread) instead of queueing in the VM.
struct Budget {
    tokens: f64,
    at: Instant,
}

impl Budget {
    fn new() -> Budget {
        Budget { tokens: TYPED_BURST as f64, at: Instant::now() }
    }

    /// Waits until `n` bytes may be typed, and spends them.
    async fn spend(&mut self, n: usize) {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * TYPED_PER_SECOND as f64;
        self.tokens = (self.tokens + refill).min(TYPED_BURST as f64);
        self.at = now;
        self.tokens -= n as f64;
        if self.tokens < 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(-self.tokens / TYPED_PER_SECOND as f64)).await;
        }
    }
}

/// Serves an attached console on an upgraded WebSocket until either side
/// goes (the API route's half; see the module's doc).
pub async fn serve(mut ws: WebSocket, conn: tokio::net::UnixStream, attached: Attached) {
    let (mut from_vm, mut to_vm) = conn.into_split();
    let hello = serde_json::to_string(&attached).expect("a console's attachment serializes");
    if send(&mut ws, ws::Message::Text(hello.into())).await.is_err() {
        return;
    }
    let mut buf = vec![0u8; 16 << 10];
    let mut budget = Budget::new();
    loop {
        tokio::select! {
            read = from_vm.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let close = ws::CloseFrame { code: ws::close_code::NORMAL, reason: VM_CLOSED.into() };
                    let _ = send(&mut ws, ws::Message::Close(Some(close))).await;
                    return;
                }
                Ok(n) => {
                    let piece = ws::Message::Binary(axum::body::Bytes::copy_from_slice(&buf[..n]));
                    if send(&mut ws, piece).await.is_err() {
                        return;
                    }
                }
            },
            message = ws.recv() => {
                let keys = match message {
                    Some(Ok(ws::Message::Binary(b))) => b,
                    Some(Ok(ws::Message::Text(t))) => axum::body::Bytes::copy_from_slice(t.as_str().as_bytes()),
                    Some(Ok(ws::Message::Ping(_) | ws::Message::Pong(_))) => continue,
                    // A close, the connection gone, or a message over the
                    // limits: the client detaches.
                    Some(Ok(ws::Message::Close(_))) | Some(Err(_)) | None => break,
                };
                budget.spend(keys.len()).await;
                if !matches!(tokio::time::timeout(SEND_WITHIN, to_vm.write_all(&keys)).await, Ok(Ok(()))) {
                    break;
                }
            }
        }
    }
    // Detached: our end of the keys closes, the VM frees the typist's
    // place and closes its end; only then is the close answered (the
    // answer is queued, and sent by the flush).
    let _ = to_vm.shutdown().await;
    let _ =
        tokio::time::timeout(LET_GO_WITHIN, async { while matches!(from_vm.read(&mut buf).await, Ok(n) if n > 0) {} })
            .await;
    let _ = tokio::time::timeout(SEND_WITHIN, ws.flush()).await;
}

/// Sends one message, giving up on a client that does not read.
async fn send(ws: &mut WebSocket, message: ws::Message) -> Result<(), ()> {
    match tokio::time::timeout(SEND_WITHIN, ws.send(message)).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// An agent's console, as a client holds it.
pub type Upstream = WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

/// The hosts whose records say they run VM `name`'s live side (a primary,
/// or the VM unprotected): where its console is. After a failover, the
/// dead host's record may still say so for a lease's time; [`open`] tries
/// each.
pub fn live_hosts(hosts: &[HostRecord], name: &str) -> Result<Vec<HostRecord>, ConsoleError> {
    let sides: Vec<(&HostRecord, Role)> =
        hosts.iter().filter_map(|h| h.vms.iter().find(|v| v.name == name).map(|v| (h, v.role))).collect();
    if sides.is_empty() {
        return Err(ConsoleError::NoVm(name.into()));
    }
    let live: Vec<HostRecord> = sides
        .iter()
        .filter(|(_, r)| matches!(r, Role::Primary | Role::Unprotected))
        .map(|(h, _)| (*h).clone())
        .collect();
    if live.is_empty() {
        let said: Vec<String> = sides.iter().map(|(h, r)| format!("{} on {}", r.word(), h.id)).collect();
        return Err(ConsoleError::NoLiveSide { vm: name.into(), sides: said.join(", ") });
    }
    Ok(live)
}

/// Opens VM `name`'s console on its live side, trying each host that
/// says it runs it ([`live_hosts`]): the connection and its first
/// message. The last refusal if none attaches.
pub async fn open(
    hosts: &[HostRecord],
    credentials: &Credentials,
    name: &str,
    read_only: bool,
) -> Result<(Upstream, Attached), ConsoleError> {
    crate::model::check_vm_name(name).map_err(ConsoleError::Api)?;
    let tls = credentials.client_config()?;
    let mut last = None;
    for host in live_hosts(hosts, name)? {
        match connect(&host.api, tls.clone(), &credentials.token, name, read_only).await {
            Ok(c) => return Ok(c),
            // A refusal says more than a host that did not answer.
            Err(e @ ConsoleError::Api(_)) => last = Some(e),
            Err(e) => {
                if !matches!(last, Some(ConsoleError::Api(_))) {
                    last = Some(e);
                }
            }
        }
    }
    Err(last.expect("live_hosts found at least one"))
}

/// Opens the console of VM `name` on the agent at `api`
/// (`https://IP:PORT`).
pub async fn connect(
    api: &str,
    tls: Arc<rustls::ClientConfig>,
    token: &str,
    name: &str,
    read_only: bool,
) -> Result<(Upstream, Attached), ConsoleError> {
    let url = format!(
        "{}/v1/vms/{name}/console{}",
        api.trim_end_matches('/'),
        if read_only { "?read_only=true" } else { "" }
    );
    let transport = |problem: String| ConsoleError::Transport { url: url.clone(), problem };
    let protocol = |problem: String| ConsoleError::Protocol { url: url.clone(), problem };
    let addr: SocketAddr = api
        .strip_prefix("https://")
        .and_then(|a| a.trim_end_matches('/').parse().ok())
        .ok_or_else(|| transport(format!("{api:?} is not https://IP:PORT")))?;
    let within = |what: &str| format!("{what} took over {} s", ATTACH_WITHIN.as_secs());
    let tcp = tokio::time::timeout(CONNECT_WITHIN, TcpStream::connect(addr))
        .await
        .map_err(|_| transport(format!("connecting took over {} s", CONNECT_WITHIN.as_secs())))?
        .map_err(|e| transport(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let server = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = tokio::time::timeout(ATTACH_WITHIN, tokio_rustls::TlsConnector::from(tls).connect(server, tcp))
        .await
        .map_err(|_| transport(within("the TLS handshake")))?
        .map_err(|e| transport(e.to_string()))?;
    let mut request =
        url.replacen("https://", "wss://", 1).into_client_request().map_err(|e| protocol(e.to_string()))?;
    let auth = format!("Bearer {token}").parse().map_err(|_| protocol("the token is not a header's value".into()))?;
    request.headers_mut().insert("authorization", auth);
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
        .max_write_buffer_size(4 * MAX_MESSAGE);
    let handshake = tokio_tungstenite::client_async_with_config(request, tls, Some(config));
    let mut upstream = match tokio::time::timeout(ATTACH_WITHIN, handshake).await {
        Err(_) => return Err(transport(within("the agent's answer"))),
        Ok(Ok((ws, _))) => ws,
        // The agent refused: its typed error, in the body.
        Ok(Err(tungstenite::Error::Http(response))) => {
            let status = response.status().as_u16();
            let body = response.body().as_deref().unwrap_or_default();
            return Err(match serde_json::from_slice::<ApiError>(body) {
                Ok(e) => ConsoleError::Api(e),
                Err(e) => protocol(format!("it answered {status} with a body that is not the API's: {e}")),
            });
        }
        Ok(Err(e)) => return Err(transport(e.to_string())),
    };
    let first = tokio::time::timeout(ATTACH_WITHIN, upstream.next())
        .await
        .map_err(|_| transport(within("its first message")))?;
    match first {
        Some(Ok(tungstenite::Message::Text(t))) => {
            let attached = serde_json::from_str(t.as_str()).map_err(|e| protocol(format!("its first message: {e}")))?;
            Ok((upstream, attached))
        }
        Some(Ok(other)) => Err(protocol(format!("its first message was not the attachment: {other:?}"))),
        Some(Err(e)) => Err(transport(e.to_string())),
        None => Err(transport("it closed the connection".into())),
    }
}

/// [`open`] for a blocking caller (the command line): the console as the
/// local end of a socket pair, which a thread of its own (with a runtime
/// of its own) relays to the agent's WebSocket until either end closes,
/// so the caller reads and writes it as it does a VM's control socket
/// (`ftvm console`'s terminal loop): shutting down its writing side
/// detaches.
pub fn open_blocking(
    hosts: Vec<HostRecord>,
    credentials: Credentials,
    name: String,
    read_only: bool,
) -> Result<(std::os::unix::net::UnixStream, Attached), ConsoleError> {
    let local_error =
        |e: std::io::Error| ConsoleError::Transport { url: "a local socket pair".into(), problem: e.to_string() };
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(local_error)?;
    theirs.set_nonblocking(true).map_err(local_error)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(local_error)?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ftvm-console-ws".into())
        .spawn(move || {
            runtime.block_on(async move {
                match open(&hosts, &credentials, &name, read_only).await {
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                    Ok((upstream, attached)) => {
                        let _ = tx.send(Ok(attached));
                        if let Ok(local) = tokio::net::UnixStream::from_std(theirs) {
                            bridge(upstream, local).await;
                        }
                    }
                }
            })
        })
        .map_err(local_error)?;
    let attached = rx.recv().map_err(|_| ConsoleError::Transport {
        url: "the console's thread".into(),
        problem: "it ended without an answer".into(),
    })??;
    Ok((ours, attached))
}

/// Relays between the agent's WebSocket and a local socket: the local
/// end's EOF is a detach (a close, whose answer is awaited); the agent's
/// close closes the local socket.
async fn bridge(mut upstream: Upstream, local: tokio::net::UnixStream) {
    let (mut from_user, mut to_user) = local.into_split();
    let mut buf = vec![0u8; 16 << 10];
    // Set once detaching: until when the agent's answer is awaited.
    let mut let_go: Option<Instant> = None;
    loop {
        tokio::select! {
            read = from_user.read(&mut buf), if let_go.is_none() => match read {
                Ok(0) | Err(_) => {
                    let_go = Some(Instant::now() + LET_GO_WITHIN);
                    if upstream.close(None).await.is_err() {
                        break;
                    }
                }
                Ok(n) => {
                    let keys = tungstenite::Message::Binary(buf[..n].to_vec().into());
                    if !matches!(tokio::time::timeout(SEND_WITHIN, upstream.send(keys)).await, Ok(Ok(()))) {
                        break;
                    }
                }
            },
            message = upstream.next() => match message {
                Some(Ok(tungstenite::Message::Binary(b))) => {
                    if to_user.write_all(&b).await.is_err() {
                        break;
                    }
                }
                Some(Ok(tungstenite::Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
            _ = tokio::time::sleep_until(let_go.unwrap_or_else(Instant::now)), if let_go.is_some() => break,
        }
    }
    let _ = tokio::time::timeout(LET_GO_WITHIN, upstream.flush()).await;
    let _ = to_user.shutdown().await;
}

/// Relays a browser's WebSocket (the dashboard's console) to a VM's
/// console on its agent, both ways, until either goes; a close of one is
/// passed to the other (the browser's is a detach, waited for as in
/// [`bridge`]).
pub async fn relay(mut browser: WebSocket, mut upstream: Upstream) {
    // Set once the browser detached: until when the agent's answer is awaited.
    let mut let_go: Option<Instant> = None;
    loop {
        tokio::select! {
            message = upstream.next() => match message {
                Some(Ok(tungstenite::Message::Binary(b))) => {
                    if send(&mut browser, ws::Message::Binary(b)).await.is_err() {
                        break;
                    }
                }
                Some(Ok(tungstenite::Message::Text(t))) => {
                    if send(&mut browser, ws::Message::Text(t.as_str().into())).await.is_err() {
                        break;
                    }
                }
                Some(Ok(tungstenite::Message::Close(frame))) => {
                    if let_go.is_none() {
                        let reason = frame.map_or_else(|| VM_CLOSED.to_string(), |f| f.reason.as_str().to_string());
                        let close = ws::CloseFrame { code: ws::close_code::NORMAL, reason: reason.into() };
                        let _ = send(&mut browser, ws::Message::Close(Some(close))).await;
                    }
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    let close = ws::CloseFrame { code: ws::close_code::AWAY, reason: "the VM's agent went away".into() };
                    let _ = send(&mut browser, ws::Message::Close(Some(close))).await;
                    break;
                }
            },
            message = browser.recv(), if let_go.is_none() => {
                let keys = match message {
                    Some(Ok(ws::Message::Binary(b))) => b,
                    Some(Ok(ws::Message::Text(t))) => axum::body::Bytes::copy_from_slice(t.as_str().as_bytes()),
                    Some(Ok(ws::Message::Ping(_) | ws::Message::Pong(_))) => continue,
                    Some(Ok(ws::Message::Close(_))) | Some(Err(_)) | None => {
                        let_go = Some(Instant::now() + LET_GO_WITHIN);
                        if upstream.close(None).await.is_err() {
                            break;
                        }
                        continue;
                    }
                };
                let keys = tungstenite::Message::Binary(keys);
                if !matches!(tokio::time::timeout(SEND_WITHIN, upstream.send(keys)).await, Ok(Ok(()))) {
                    break;
                }
            },
            _ = tokio::time::sleep_until(let_go.unwrap_or_else(Instant::now)), if let_go.is_some() => break,
        }
    }
    let _ = tokio::time::timeout(LET_GO_WITHIN, browser.flush()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::HostVm;

    fn host(id: &str, vms: &[(&str, Role)]) -> HostRecord {
        HostRecord {
            id: id.into(),
            api: format!("https://10.0.0.{}:7800", id.len()),
            address: "10.0.0.1".into(),
            cores: 2,
            memory_bytes: 1 << 30,
            free_memory_bytes: 1 << 29,
            vms: vms
                .iter()
                .map(|(n, r)| HostVm { name: (*n).into(), role: *r, protect: None, memory_mib: 512 })
                .collect(),
            version: "0".into(),
            images: Vec::new(),
        }
    }

    #[test]
    fn the_console_is_where_the_live_side_runs() {
        let hosts = [
            host("a", &[("web", Role::Backup)]),
            host("b", &[("web", Role::Primary), ("db", Role::Ended)]),
            host("c", &[("db", Role::Backup)]),
        ];
        let live = live_hosts(&hosts, "web").unwrap();
        assert_eq!(live.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), ["b"]);
        let Err(ConsoleError::NoLiveSide { sides, .. }) = live_hosts(&hosts, "db") else {
            panic!("db has no live side")
        };
        assert_eq!(sides, "ended on b, backup on c");
        assert!(matches!(live_hosts(&hosts, "nosuch"), Err(ConsoleError::NoVm(_))));
        let e = live_hosts(&hosts, "db").unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_keys_waits_instead_of_queueing() {
        let mut budget = Budget::new();
        let t0 = tokio::time::Instant::now();
        budget.spend(TYPED_BURST).await;
        assert!(t0.elapsed() < Duration::from_millis(10), "a burst goes at once");
        budget.spend(TYPED_PER_SECOND * 2).await;
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(1900), "{waited:?}");
    }
}
