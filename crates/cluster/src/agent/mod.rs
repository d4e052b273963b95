//! `ftvm agent`: the daemon of one host of the cluster. In the
//! foreground, logging to stderr (systemd-friendly), it
//! - runs its host's VMs as child processes ([`vms`]), and at its
//!   start adopts those an agent before it left running (one killed, or
//!   crashed: only SIGTERM stops the VMs);
//! - records its host in etcd under a lease it keeps alive
//!   (`/ftvm/hosts/<id>`: identity, addresses, cores, memory, free
//!   memory, its VMs and their parts), rewritten as they change, so the
//!   host vanishes from the cluster a lease's time after its agent does;
//! - serves the HTTP/JSON API (docs/api/openapi.json) and the Prometheus
//!   metrics, every request but `/healthz` authenticated by the
//!   cluster's bearer token (a VM's console too: [`crate::console`]), and
//!   the dashboard at `/ui`
//!   ([`crate::dashboard`], logged into with the same token);
//! - runs the cluster's controller when elected ([`crate::control::controller`]);
//! - on SIGTERM or SIGINT stops taking requests, asks every VM to stop
//!   (a protected primary hands over to its backup, a plain VM's guest
//!   powers off), waits for them, and withdraws its record.
//!
//! etcd being unreachable never stops a VM: the record is written again
//! once etcd answers.
//!
//! Its parts: the API's handlers here; [`vms`], the VM supervisor (its
//! VMs as child processes, spoken to through their control sockets);
//! [`https`], the TLS listener; [`refusal`], every refusal of the API as
//! the model's JSON error; [`metrics`], the Prometheus metrics of the host
//! and its VMs; [`keys`], each VM's pair key, shared by its hosts through
//! the store.

pub mod https;
pub mod keys;
pub mod metrics;
pub mod refusal;
pub mod vms;

use crate::agent::https::PerSource;
use crate::agent::vms::{VmEvent, Vms};
use crate::authority::credentials::Credentials;
use crate::control::events::{ClusterEvent, Cursor, Histories, History, What};
use crate::model::{ApiError, BackupRequest, BackupStarted, Done, HostRecord, ProtectRequest, VmInfo, VmSpec};
use crate::store::session::Leased;
use crate::store::{self, EtcdStore, Store, HOST_LEASE};
use axum::extract::{Path as UrlPath, Request as HttpRequest, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ftvm_api::pair_config::DEFAULT_HEARTBEAT_PORT;
use ftvm_api::{PairConfig, ProtectConfig, Reply, Request};
use ftvm_etcd::Endpoints;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How often the record is renewed and rewritten.
const REFRESH: Duration = Duration::from_secs(2);
/// How long a protect or handover may take before the API gives up
/// waiting (the VM's own attempt goes on and ends either way).
const LONG_REQUEST: Duration = Duration::from_secs(300);

/// What an agent is told at its start.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The host's identity in the cluster.
    pub id: String,
    /// etcd's endpoints (TLS, with the credentials' certificate).
    pub etcd: Endpoints,
    /// Where the API listens.
    pub listen: SocketAddr,
    /// This host's address on the cluster's network (backups listen
    /// there).
    pub address: IpAddr,
    /// The agent's files: the VMs' directories, the pair keys.
    pub state_dir: PathBuf,
    /// The cluster's credentials: the bearer token every API request
    /// must carry, and the certificate the API is served with.
    pub credentials: Credentials,
    /// The ftvm binary the VMs run.
    pub ftvm: PathBuf,
    /// The guest images this host boots VMs from (`ftvm image build`
    /// makes them; default: the cache's, `ftvm image list`).
    pub images: PathBuf,
    /// The memory this host's VMs may have in all, bytes; None: the
    /// host's memory.
    pub vm_memory: Option<u64>,
}

impl AgentConfig {
    /// The memory this host offers its VMs in all, bytes.
    fn vm_memory_bytes(&self) -> u64 {
        let host = ftvm_host::memory::capacity().unwrap_or(0);
        self.vm_memory.map_or(host, |m| m.min(host))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("cannot make the state directory {}: {source}", .dir.display())]
    StateDir { dir: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Store(#[from] store::StoreError),
    #[error("{0}")]
    Credentials(#[from] crate::authority::credentials::CredentialsError),
    #[error("the API server failed: {0}")]
    Serve(String),
}

/// The agent's state, shared by its tasks and API handlers.
struct Agent {
    config: AgentConfig,
    vms: Vms,
    /// The event log's store: a blocking client (its calls go to the
    /// blocking pool), made once and never dropped, since dropping its
    /// runtime inside the agent's would panic.
    store: &'static EtcdStore,
    /// The consoles that may still be opened ([`crate::console::SESSIONS`]).
    consoles: Arc<tokio::sync::Semaphore>,
    /// The event streams open ([`EVENT_STREAMS`], per client address too).
    streams: PerSource,
    /// Each VM's history as the event log tells it, kept up to date by
    /// [`follow_histories`] (None until the log was first read): what
    /// `/metrics` serves, from memory.
    histories: std::sync::Mutex<Option<HashMap<String, History>>>,
}

/// How many VM events may wait for etcd before new ones are dropped.
const EVENT_QUEUE: usize = 1024;
/// Event streams (`GET /v1/events`) open at once, in all and per client
/// address; one beyond is refused (503): each reads etcd every
/// [`crate::control::events::POLL`].
pub const EVENT_STREAMS: usize = 64;
pub const EVENT_STREAMS_PER_SOURCE: usize = 8;
/// How often the histories `/metrics` serves are brought up to date.
const HISTORIES_EVERY: Duration = Duration::from_secs(2);

impl Agent {
    /// The host's record as it stands.
    async fn record(&self) -> HostRecord {
        let memory = self.config.vm_memory_bytes();
        HostRecord {
            id: self.config.id.clone(),
            api: format!("https://{}", self.config.listen),
            address: self.config.address.to_string(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            memory_bytes: memory,
            free_memory_bytes: memory.saturating_sub(self.vms.promised_memory()),
            vms: self.vms.summary().await,
            version: env!("CARGO_PKG_VERSION").into(),
            images: self.vms.images(),
        }
    }

    /// etcd's endpoints, this host's own member first, for the agent's
    /// own connections and its VMs': each asks the first member first,
    /// and when a pair's other host dies, the member most likely alive is
    /// the one beside the VM that must go live (the dead host's own member
    /// costs its arbiter a try).
    fn etcd_local_first(&self) -> Endpoints {
        Agent::local_first(&self.config)
    }

    fn local_first(config: &AgentConfig) -> Endpoints {
        let own = |e: &String| {
            e.split_once("://")
                .and_then(|(_, r)| r.rsplit_once(':'))
                .and_then(|(host, _)| host.trim_matches(['[', ']']).parse::<IpAddr>().ok())
                == Some(config.address)
        };
        config.etcd.sorted_by_key(|e| !own(e))
    }

    /// Where this host keeps a VM's pair key (the cluster's, from etcd:
    /// [`crate::agent::keys`]).
    fn pair_key(&self, vm: &str) -> PathBuf {
        self.config.state_dir.join("keys").join(format!("{vm}.key"))
    }
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(config: AgentConfig) -> Result<(), AgentError> {
    // The state directory holds the guests' disks, consoles and journals
    // and the pairs' keys: the owner's only (issue 68: disks were 0644 in
    // directories of 0755). The umask covers whatever this process and the
    // VMs it starts make there without saying a mode (a VM's journal and
    // control socket, files of later code); the modes set here and in
    // `vms` say it where the file is made, and mend a directory an older
    // agent left open.
    // SAFETY: umask only swaps the process's file mode mask.
    unsafe { libc::umask(0o077) };
    // Connections, VMs' sockets and files: the soft limit (often 1024)
    // would be reached before the server's own limits (issue 68: 1,000
    // slow connections left no descriptor for a legitimate request).
    if let Err(e) = crate::agent::https::raise_descriptor_limit() {
        eprintln!("ftvm agent: cannot raise the limit of open files ({e}); connections may be refused early");
    }
    for dir in [config.state_dir.clone(), config.state_dir.join("vms"), config.state_dir.join("keys")] {
        crate::agent::vms::private_dir(&dir).map_err(|source| AgentError::StateDir { dir, source })?;
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| AgentError::Listen { addr: config.listen, source })?;
    let (events_tx, events_rx) = tokio::sync::mpsc::channel(EVENT_QUEUE);
    let vms =
        Vms::new(&config.id, &config.state_dir, &config.ftvm, &config.images, config.vm_memory_bytes(), events_tx);
    let adopted = vms.adopt();
    if !adopted.is_empty() {
        eprintln!("ftvm agent: {} VM(s) of an agent before this one: {}", adopted.len(), adopted.join(", "));
    }
    let own_first = Agent::local_first(&config);
    let store: &'static EtcdStore = Box::leak(Box::new(EtcdStore::new(own_first)?));
    let consoles = Arc::new(tokio::sync::Semaphore::new(crate::console::SESSIONS));
    let streams = PerSource::new(EVENT_STREAMS, EVENT_STREAMS_PER_SOURCE);
    let agent = Arc::new(Agent { config, vms, store, consoles, streams, histories: Default::default() });
    tokio::spawn(publish_events(agent.clone(), events_rx));
    let tls = agent.config.credentials.server_config()?;
    eprintln!("ftvm agent: host {} serving on https://{}", agent.config.id, agent.config.listen);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let registration = tokio::spawn(register(agent.clone(), stop_rx.clone()));
    let controller = tokio::spawn(crate::control::controller::run(
        agent.config.id.clone(),
        agent.etcd_local_first(),
        agent.config.credentials.clone(),
        stop_rx.clone(),
    ));
    let dashboard =
        crate::dashboard::Dashboard::new(&agent.config.id, agent.etcd_local_first(), agent.config.credentials.clone());
    tokio::spawn(follow_histories(agent.clone(), stop_rx.clone()));
    let app = router(agent.clone(), dashboard);
    let server = tokio::spawn(crate::agent::https::serve(listener, tls, app, stop_rx.clone()));

    wait_for_signal().await;
    eprintln!("ftvm agent: stopping: each VM is asked to stop (a protected primary hands over)");
    agent.vms.stop_all().await;
    let _ = stop_tx.send(true);
    let _ = registration.await;
    let _ = controller.await;
    if let Err(e) = server.await {
        return Err(AgentError::Serve(e.to_string()));
    }
    eprintln!("ftvm agent: stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        // No handler: only a kill stops the agent, and its VMs run on.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Keeps the host's record in etcd under a lease until told to stop, then
/// withdraws it (revokes the lease). Every failure is logged once per
/// outage and retried: the VMs run on regardless.
async fn register(agent: Arc<Agent>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let endpoints = agent.etcd_local_first();
    let key = store::host_key(&agent.config.id);
    let mut session: Option<Leased> = None;
    // The record as last written under the session's lease: it is written
    // again only when it changed (etcd keeps every revision until its
    // history is compacted; a rewrite every 2 s would be its largest
    // growth: docs/ARCHITECTURE.md, "Capacity").
    let mut written: Option<String> = None;
    let mut down_since_logged = false;
    loop {
        let attempt = async {
            if session.is_none() {
                session = Some(Leased::open(&endpoints, HOST_LEASE).await?);
                written = None;
            }
            let s = session.as_mut().expect("made above");
            // Renewed first: a lease that expired while etcd was away (or
            // the agent could not reach it) is found so here, and the
            // next attempt opens a new session. A put under it would fail
            // ("lease not found") every time the record had changed
            // meanwhile, and the record never came back: a host whose VM
            // had just gone live vanished from the cluster for good.
            s.renew().await?;
            let record = serde_json::to_string(&agent.record().await).expect("a record serializes");
            if written.as_ref() != Some(&record) {
                s.put(&key, &record).await?;
                written = Some(record);
            }
            Ok::<_, crate::store::session::SessionError>(())
        };
        match tokio::time::timeout(REFRESH * 2, attempt).await {
            Ok(Ok(())) => {
                if down_since_logged {
                    eprintln!("ftvm agent: etcd answers again; the host's record is back");
                    down_since_logged = false;
                }
            }
            Ok(Err(e)) => {
                if !down_since_logged {
                    eprintln!("ftvm agent: cannot keep the host's record in etcd ({e}); trying again, VMs run on");
                    down_since_logged = true;
                }
                crate::store::session::after_failure(&mut session).await;
            }
            Err(_) => {
                if !down_since_logged {
                    eprintln!("ftvm agent: etcd does not answer; trying again, VMs run on");
                    down_since_logged = true;
                }
                crate::store::session::after_failure(&mut session).await;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(REFRESH) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    if let Some(s) = session {
        s.revoke().await;
    }
}

/// Writes each of the VMs' pair events to the cluster's event log, in
/// the order they came. A write that fails (etcd away) loses that event,
/// said once per outage: the VMs' streams are read on regardless.
async fn publish_events(agent: Arc<Agent>, mut events: tokio::sync::mpsc::Receiver<VmEvent>) {
    let mut failing = false;
    while let Some(VmEvent { vm, pid, record }) = events.recv().await {
        let key = crate::control::events::pair_key(&agent.config.id, &vm, pid, &record);
        let seq = record.seq;
        let event = ClusterEvent {
            id: 0,
            unix_ms: record.unix_ms,
            host: agent.config.id.clone(),
            vm: Some(vm.clone()),
            what: What::Pair { event: record.event },
        };
        let store = agent.store;
        let written = tokio::task::spawn_blocking(move || crate::control::events::publish(store, &key, &event)).await;
        match written {
            Ok(Ok(())) => {
                failing = false;
                agent.vms.published(&vm, pid, seq);
            }
            Ok(Err(e)) if !failing => {
                eprintln!("ftvm agent: cannot add to the event log ({e}); events are lost until etcd answers");
                failing = true;
            }
            _ => {}
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self)).into_response()
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

fn router(agent: Arc<Agent>, dashboard: Arc<crate::dashboard::Dashboard>) -> Router {
    let api = Router::new()
        .route("/v1/host", get(host))
        .route("/v1/vms", get(list_vms).post(create_vm))
        .route("/v1/vms/{name}", get(show_vm).delete(delete_vm))
        .route("/v1/vms/{name}/protect", post(protect_vm))
        .route("/v1/vms/{name}/unprotect", post(unprotect_vm))
        .route("/v1/vms/{name}/handover", post(handover_vm))
        .route("/v1/vms/{name}/console", get(console_vm))
        .route("/v1/backups", post(create_backup))
        .route("/v1/events", get(events))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(agent.clone(), authenticate));
    Router::new()
        .merge(api)
        // The dashboard: its own login, limits and headers.
        .merge(crate::dashboard::routes(dashboard))
        .route("/healthz", get(|| async { "ok\n" }))
        // A request body of more than 64 KiB is no spec.
        .layer(axum::extract::DefaultBodyLimit::max(64 << 10))
        .layer(middleware::map_response(crate::agent::refusal::as_json))
        .with_state(agent)
}

/// Every request but /healthz carries `Authorization: Bearer TOKEN`.
async fn authenticate(State(agent): State<Arc<Agent>>, request: HttpRequest, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !crate::authority::token::matches(given, &agent.config.credentials.token) {
        let e = ApiError::Unauthorized("missing or wrong bearer token".into());
        let mut r = e.into_response();
        r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return r;
    }
    next.run(request).await
}

async fn host(State(agent): State<Arc<Agent>>) -> ApiResult<HostRecord> {
    Ok(Json(agent.record().await))
}

async fn list_vms(State(agent): State<Arc<Agent>>) -> ApiResult<Vec<VmInfo>> {
    Ok(Json(agent.vms.all().await))
}

async fn create_vm(State(agent): State<Arc<Agent>>, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let spec: VmSpec = parse_body(&body)?;
    let name = spec.name.clone();
    // Seconds of file work (the image's disk copied, maybe grown): off the
    // runtime's workers, which serve every other request meanwhile.
    tokio::task::block_in_place(|| agent.vms.create(spec))?;
    Ok((StatusCode::CREATED, Json(agent.vms.info(&name).await?)).into_response())
}

async fn show_vm(State(agent): State<Arc<Agent>>, UrlPath(name): UrlPath<String>) -> ApiResult<VmInfo> {
    Ok(Json(agent.vms.info(&name).await?))
}

/// `DELETE /v1/vms/{name}`'s query.
#[derive(Debug, serde::Deserialize)]
struct DeleteQuery {
    /// Only if its process has ended (else 409): what the controller asks
    /// when it clears away an old process, so that a new process of the
    /// same name, started since it looked, is never the one stopped.
    ended_only: Option<bool>,
}

async fn delete_vm(
    State(agent): State<Arc<Agent>>,
    UrlPath(name): UrlPath<String>,
    query: Result<axum::extract::Query<DeleteQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Done> {
    let axum::extract::Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let how = if q.ended_only == Some(true) { agent.vms.forget_ended(&name)? } else { agent.vms.delete(&name).await? };
    Ok(Json(Done { message: format!("VM {name} stopped: its process {how}") }))
}

async fn protect_vm(
    State(agent): State<Arc<Agent>>,
    UrlPath(name): UrlPath<String>,
    body: axum::body::Bytes,
) -> ApiResult<Done> {
    // Checked before any key or file is made from them; the VM's request
    // is typed, each field a value (issue 68: no field reaches a parser).
    crate::model::check_vm_name(&name)?;
    let req: ProtectRequest = parse_body(&body)?;
    let backup = req.check()?;
    let pair = PairConfig {
        etcd: Some(agent.etcd_local_first().joined()),
        etcd_credentials: Some(agent.config.credentials.dir.clone()),
        vm_name: Some(name.clone()),
        pair_key: Some(agent.pair_key(&name)),
        heartbeat_port: req.heartbeat_port.unwrap_or(DEFAULT_HEARTBEAT_PORT),
        ..PairConfig::default()
    };
    let config = ProtectConfig { mode: req.mode, ..ProtectConfig::new(backup, pair) };
    let request = Request::Protect(Box::new(config));
    crate::agent::keys::ensure(&agent.config.etcd, &name, &agent.pair_key(&name))
        .await
        .map_err(ApiError::Unavailable)?;
    let reply = agent.vms.ask(&name, request, LONG_REQUEST).await?;
    Ok(Json(Done { message: reply.to_string() }))
}

async fn unprotect_vm(State(agent): State<Arc<Agent>>, UrlPath(name): UrlPath<String>) -> ApiResult<Done> {
    let reply = agent.vms.ask(&name, Request::Unprotect, LONG_REQUEST).await?;
    Ok(Json(Done { message: reply.to_string() }))
}

async fn handover_vm(State(agent): State<Arc<Agent>>, UrlPath(name): UrlPath<String>) -> ApiResult<Done> {
    let reply = agent.vms.ask(&name, Request::Handover, LONG_REQUEST).await?;
    if !matches!(reply, Reply::HandedOver { .. }) {
        return Err(ApiError::Internal(format!("unexpected answer to handover: {reply}")));
    }
    Ok(Json(Done { message: reply.to_string() }))
}

/// The VM's console, if its live side runs here: a WebSocket
/// ([`crate::console`]). Refused before the upgrade, in the API's JSON:
/// a VM this host does not run (404), one whose process here is no live
/// side or whose typist's place is taken (409), a request that is no
/// WebSocket's (400).
async fn console_vm(
    State(agent): State<Arc<Agent>>,
    UrlPath(name): UrlPath<String>,
    query: Result<axum::extract::Query<crate::console::ConsoleQuery>, axum::extract::rejection::QueryRejection>,
    upgrade: Result<axum::extract::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    crate::model::check_vm_name(&name)?;
    let axum::extract::Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let socket = agent.vms.console_socket(&name)?;
    let upgrade = upgrade
        .map_err(|e| ApiError::BadRequest(format!("the console is a WebSocket: {}", e.body_text().to_lowercase())))?;
    let seat = agent.consoles.clone().try_acquire_owned().map_err(|_| {
        ApiError::Unavailable(format!("{} consoles are open on this host: try again later", crate::console::SESSIONS))
    })?;
    let (conn, typing) = crate::console::attach_local(socket, q.read_only == Some(true)).await?;
    let attached = crate::console::Attached { vm: name, host: agent.config.id.clone(), typing };
    Ok(crate::console::limits(upgrade).on_upgrade(move |ws| async move {
        crate::console::serve(ws, conn, attached).await;
        drop(seat);
    }))
}

async fn create_backup(State(agent): State<Arc<Agent>>, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: BackupRequest = parse_body(&body)?;
    // Before the key file is written from its name (issue 68: a name
    // `../../victim` was refused only after its key was written there).
    req.spec.check()?;
    let no_port = |e: std::io::Error| ApiError::Internal(format!("no free port: {e}"));
    let port = free_port(agent.config.address).map_err(no_port)?;
    let heartbeat_port = free_udp_port(agent.config.address).map_err(no_port)?;
    let listen = SocketAddr::new(agent.config.address, port);
    let key = agent.pair_key(&req.spec.name);
    crate::agent::keys::ensure(&agent.config.etcd, &req.spec.name, &key).await.map_err(ApiError::Unavailable)?;
    // The image's disk copied where this host has it (see create_vm).
    tokio::task::block_in_place(|| {
        agent.vms.create_backup(
            req.spec,
            listen,
            heartbeat_port,
            &agent.etcd_local_first().joined(),
            &agent.config.credentials.dir,
            &key,
        )
    })?;
    Ok((StatusCode::CREATED, Json(BackupStarted { listen: listen.to_string(), heartbeat_port })).into_response())
}

async fn metrics(State(agent): State<Arc<Agent>>) -> Response {
    let vms = agent.vms.all().await;
    let host = agent.record().await;
    let history = agent.histories.lock().expect("the histories' lock").clone();
    let body = crate::agent::metrics::render(&host, &vms, history.as_ref());
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body).into_response()
}

/// Folds the cluster's event log into each VM's history as it grows, for
/// `/metrics` to serve from memory (issue 68: each scrape read the whole
/// log from etcd, and with a thousand clients connected it timed out).
async fn follow_histories(agent: Arc<Agent>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut cursor = Cursor::default();
    let mut folded = Histories::default();
    loop {
        let (moved, read) = read_events(agent.store, cursor).await;
        cursor = moved;
        // etcd away: the histories as last read, and a try again later.
        if let Ok(events) = read {
            let mut kept = agent.histories.lock().expect("the histories' lock");
            if !events.is_empty() || kept.is_none() {
                events.iter().for_each(|e| folded.read(e));
                *kept = Some(folded.by_vm().clone());
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(HISTORIES_EVERY) => {}
        }
    }
}

/// The events after `cursor`, read on the blocking pool; the cursor
/// comes back moved.
async fn read_events(store: &'static dyn Store, mut cursor: Cursor) -> (Cursor, Result<Vec<ClusterEvent>, ApiError>) {
    let before = cursor.clone();
    match tokio::task::spawn_blocking(move || {
        let read = cursor.next(store);
        (cursor, read)
    })
    .await
    {
        Ok((cursor, read)) => {
            (cursor, read.map_err(|e| ApiError::Unavailable(format!("cannot read the event log: {e}"))))
        }
        Err(e) => (before, Err(ApiError::Internal(format!("reading the event log: {e}")))),
    }
}

/// `GET /v1/events`'s query.
#[derive(Debug, serde::Deserialize)]
struct EventsQuery {
    /// Only this VM's events.
    vm: Option<String>,
    /// Only events after this id (as an SSE client's `Last-Event-ID`).
    after: Option<i64>,
    /// false: the events so far as one JSON list, not a stream.
    follow: Option<bool>,
}

/// The cluster's event log: by default a stream of server-sent events
/// (each event's `id:` its id, `data:` its JSON), first those kept, then
/// each as it is written; with `follow=false`, the events so far as JSON.
async fn events(
    State(agent): State<Arc<Agent>>,
    axum::extract::ConnectInfo(client): axum::extract::ConnectInfo<SocketAddr>,
    query: Result<axum::extract::Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let axum::extract::Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let resumed = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok());
    let cursor = Cursor { after: resumed.or(q.after).unwrap_or(0), vm: q.vm };
    let (cursor, first) = read_events(agent.store, cursor).await;
    let first = first?;
    if q.follow == Some(false) {
        return Ok(Json(first).into_response());
    }
    let held = agent.streams.take(client.ip()).ok_or_else(|| {
        ApiError::Unavailable(format!(
            "too many event streams open ({EVENT_STREAMS} in all, {EVENT_STREAMS_PER_SOURCE} from one address): \
             try again later"
        ))
    })?;
    let store = agent.store;
    // Ends when the client goes (the stream is dropped with its response,
    // and its place among the streams with it).
    let stream = futures_util::stream::unfold(
        (VecDeque::from(first), cursor, held),
        move |(mut pending, mut cursor, held)| async move {
            loop {
                if let Some(e) = pending.pop_front() {
                    let data = serde_json::to_string(&e).expect("an event serializes");
                    let sse = Event::default().id(e.id.to_string()).data(data);
                    return Some((Ok::<_, std::convert::Infallible>(sse), (pending, cursor, held)));
                }
                tokio::time::sleep(crate::control::events::POLL).await;
                // etcd away: the stream waits for it, kept alive meanwhile.
                let (moved, new) = read_events(store, cursor).await;
                cursor = moved;
                pending.extend(new.unwrap_or_default());
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

/// A JSON body, or a one-line refusal.
fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("the request's body: {e}")))
}

/// A TCP port free on `ip` now (the kernel's choice).
fn free_port(ip: IpAddr) -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(SocketAddr::new(ip, 0))?.local_addr()?.port())
}

/// A UDP port free on `ip` now (the kernel's choice): a backup's
/// heartbeats. Each backup has its own: with one fixed port, a host's
/// second backup could not bind it and failed at once.
fn free_udp_port(ip: IpAddr) -> std::io::Result<u16> {
    Ok(std::net::UdpSocket::bind(SocketAddr::new(ip, 0))?.local_addr()?.port())
}
