//! The dashboard every agent serves at `/ui`: the whole cluster in a
//! browser (hosts, VMs and their pairs with small live charts, the event
//! log as a timeline) and the operator's actions on it (protect, hand
//! over, move a backup or a VM, drain a host). This module owns its
//! routes, its logins and its actions; [`view`] reads the cluster,
//! [`render`] makes the HTML, and the page's small script and style sheet
//! are files beside them, compiled in (no build step, nothing fetched
//! from elsewhere: it works offline).
//!
//! Logging in: a browser cannot put the bearer token on an EventSource,
//! so `POST /ui/login` takes the token once (compared in constant time)
//! and sets a cookie holding a random session secret of this agent's
//! (HttpOnly: no script reads it; SameSite=Strict: no other site's page
//! sends it; the token itself never goes into a cookie). Every `/ui`
//! route that shows or changes the cluster needs that session; each POST
//! also needs the session's CSRF value in the `X-Ftvm-Csrf` header, which
//! only the page's own script can send.
//!
//! The actions run the same [`crate::control::ops`] functions as `ftvm cluster`,
//! on the blocking pool; each is a job whose progress and result the page
//! shows live, with the event log telling what the cluster did.
//!
//! A VM's console in the page ([`console`]): a WebSocket to this agent
//! (`/ui/console/{name}`, the session's cookie on it), relayed to the
//! console route of the agent that runs the VM's live side, with the
//! cluster's token ([`crate::console`]). A WebSocket carries no header a
//! script sets, so its first message must be the session's CSRF value,
//! and its Origin must be this agent's.

pub mod render;
pub mod view;

use crate::authority::credentials::Credentials;
use crate::control::events::{ClusterEvent, Cursor, Story};
use crate::control::ops::{Cluster, OpsError};
use crate::model::ApiError;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use ftvm_etcd::Endpoints;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The session cookie's name.
const COOKIE: &str = "ftvm_session";
/// The header every POST of the page carries.
const CSRF_HEADER: &str = "x-ftvm-csrf";
/// How long a login lasts.
const SESSION_LIFE: Duration = Duration::from_secs(12 * 3600);
/// The most sessions kept (the oldest goes): logins cannot fill memory.
const MAX_SESSIONS: usize = 64;
/// The most jobs shown, and the most running at once.
const JOBS_SHOWN: usize = 20;
const JOBS_RUNNING: usize = 4;
/// How often the cluster is looked at while someone watches.
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// How long the looks go on after the last page went away.
const IDLE_AFTER: Duration = Duration::from_secs(60);
/// How long a drain's job waits for the host to empty.
const DRAIN_WITHIN: Duration = Duration::from_secs(600);
/// How long a create's job waits for the VM's process to run (as `ftvm
/// cluster vm create`'s default --wait: a controller's pass, a disk copy).
const CREATED_WITHIN: Duration = Duration::from_secs(120);
/// How many consoles the pages may have open on this agent at once.
const CONSOLES: usize = 16;
/// How long a console's page has to send its CSRF value.
const CSRF_WITHIN: Duration = Duration::from_secs(10);

/// The page's script, style sheet: compiled in.
const APP_JS: &str = include_str!("dashboard/app.js");
const STYLE_CSS: &str = include_str!("dashboard/style.css");
/// Its icon (a browser asks for one; a refusal would be an error in the
/// page's console).
const ICON_SVG: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\"><rect width=\"16\" \
                        height=\"16\" rx=\"3\" fill=\"#2a62c9\"/><path d=\"M4 8h8M8 4v8\" stroke=\"#fff\" \
                        stroke-width=\"2\"/></svg>";
/// What a page may load and where it may send: only this agent.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                   form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A logged-in browser.
#[derive(Clone)]
struct Session {
    secret: String,
    csrf: String,
    expires: Instant,
}

/// An action asked from this agent's dashboard.
pub struct Job {
    pub id: u64,
    /// The action, in words.
    pub what: String,
    pub started_ms: u64,
    started: Instant,
    /// None while it runs; then its result in words.
    pub result: Option<Result<String, String>>,
}

impl Job {
    pub fn elapsed_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }
}

/// The dashboard's state on one agent.
pub struct Dashboard {
    host: String,
    credentials: Credentials,
    etcd: Endpoints,
    /// The cluster's client: made at first use and never dropped (its
    /// etcd connection has a runtime of its own, which must not be dropped
    /// inside the agent's).
    cluster: OnceLock<&'static Cluster>,
    sessions: Mutex<Vec<Session>>,
    jobs: Mutex<VecDeque<Job>>,
    next_job: AtomicU64,
    /// The view as last rendered, to every open page.
    view: tokio::sync::watch::Sender<Arc<String>>,
    /// A job started or ended (its count of changes).
    jobs_changed: tokio::sync::watch::Sender<u64>,
    /// The looks' history (kept while the looks pause).
    watch: Mutex<view::Watch>,
    looking: AtomicBool,
    last_page: Mutex<Instant>,
    /// The consoles that may still be opened ([`CONSOLES`]).
    consoles: Arc<tokio::sync::Semaphore>,
    /// The pages' live feeds open ([`FEEDS`], per client address too).
    feeds: crate::agent::https::PerSource,
}

/// Live feeds open at once, in all and from one address: each reads the
/// event log every [`crate::control::events::POLL`].
pub const FEEDS: usize = 64;
pub const FEEDS_PER_SOURCE: usize = 8;

impl Dashboard {
    /// The dashboard of the agent of host `host`; `etcd`: the cluster's
    /// endpoints; `credentials`: its API token and authority.
    pub fn new(host: &str, etcd: Endpoints, credentials: Credentials) -> Arc<Dashboard> {
        Arc::new(Dashboard {
            host: host.into(),
            credentials,
            etcd,
            cluster: OnceLock::new(),
            sessions: Mutex::new(Vec::new()),
            jobs: Mutex::new(VecDeque::new()),
            next_job: AtomicU64::new(1),
            view: tokio::sync::watch::channel(Arc::new("<p>Looking at the cluster…</p>".to_string())).0,
            jobs_changed: tokio::sync::watch::channel(0).0,
            watch: Mutex::new(view::Watch::default()),
            looking: AtomicBool::new(false),
            last_page: Mutex::new(Instant::now()),
            consoles: Arc::new(tokio::sync::Semaphore::new(CONSOLES)),
            feeds: crate::agent::https::PerSource::new(FEEDS, FEEDS_PER_SOURCE),
        })
    }

    async fn cluster(&self) -> Result<&'static Cluster, ApiError> {
        if let Some(c) = self.cluster.get() {
            return Ok(c);
        }
        let (etcd, credentials) = (self.etcd.clone(), self.credentials.clone());
        let made = tokio::task::spawn_blocking(move || Cluster::new(etcd, &credentials))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::Unavailable(format!("cannot reach etcd: {e}")))?;
        // Two first uses at once: the loser's client is leaked too, once.
        // Leaked before the race is decided: the loser's, dropped here (in
        // the runtime), would drop its etcd client's own runtime, a panic
        // that ended the page's looks (a run of test_dashboard_actions saw the
        // page never update when the feed and the looks started at once).
        let made: &'static Cluster = Box::leak(Box::new(made));
        Ok(*self.cluster.get_or_init(|| made))
    }

    fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let given = cookie(headers, COOKIE)?;
        let now = Instant::now();
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|s| s.expires > now);
        // Each compared in constant time: the answer's timing says nothing
        // of how close a guess came.
        sessions.iter().find(|s| crate::authority::token::matches(given, &s.secret)).cloned()
    }

    fn open_session(&self) -> Result<Session, ApiError> {
        let session = Session { secret: random_hex()?, csrf: random_hex()?, expires: Instant::now() + SESSION_LIFE };
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if sessions.len() >= MAX_SESSIONS {
            sessions.remove(0);
        }
        sessions.push(session.clone());
        Ok(session)
    }

    fn jobs_html(&self) -> String {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        render::jobs(jobs.make_contiguous())
    }

    /// Starts the looks at the cluster unless they run.
    fn watch_cluster(self: &Arc<Self>) {
        *self.last_page.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        if !self.looking.swap(true, Ordering::SeqCst) {
            tokio::spawn(look_while_watched(self.clone()));
        }
    }
}

/// 32 random bytes, as hex.
fn random_hex() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::Internal(format!("no randomness: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The value of cookie `name` in the request's headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Looks at the cluster every [`LOOK_EVERY`] while a page is open (and
/// [`IDLE_AFTER`] more), each look rendered and sent to the open pages.
async fn look_while_watched(d: Arc<Dashboard>) {
    loop {
        if let Ok(cluster) = d.cluster().await {
            if let Ok(look) = tokio::task::spawn_blocking(move || view::look(cluster)).await {
                let html = {
                    let mut watch = d.watch.lock().unwrap_or_else(|e| e.into_inner());
                    render::view(&watch.view(&look))
                };
                d.view.send_replace(Arc::new(html));
            }
        }
        tokio::time::sleep(LOOK_EVERY).await;
        let idle = d.last_page.lock().unwrap_or_else(|e| e.into_inner()).elapsed() > IDLE_AFTER;
        if idle && d.view.receiver_count() == 0 {
            d.looking.store(false, Ordering::SeqCst);
            // A page opened meanwhile may have seen the looks running and
            // not started them: take them up again for it.
            if d.view.receiver_count() == 0 || d.looking.swap(true, Ordering::SeqCst) {
                return;
            }
        }
    }
}

/// The dashboard's routes, with their state.
pub fn routes<S: Clone + Send + Sync + 'static>(d: Arc<Dashboard>) -> Router<S> {
    let private = Router::new()
        .route("/ui/stream", get(stream))
        .route("/ui/actions", post(act))
        .route("/ui/logout", post(logout))
        .route("/ui/console/{name}", get(console))
        .route_layer(middleware::from_fn_with_state(d.clone(), require_session));
    Router::new()
        .route("/ui", get(index))
        .route("/ui/login", post(login))
        .route("/ui/app.js", get(|| async { static_file("text/javascript; charset=utf-8", APP_JS) }))
        .route("/ui/style.css", get(|| async { static_file("text/css; charset=utf-8", STYLE_CSS) }))
        .route("/ui/icon.svg", get(|| async { static_file("image/svg+xml", ICON_SVG) }))
        .merge(private)
        .layer(axum::extract::DefaultBodyLimit::max(16 << 10))
        .layer(middleware::map_response(secure_headers))
        .with_state(d)
}

fn static_file(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Every dashboard answer: only this agent's own script and style, never
/// in a frame, never cached (a page shows the cluster).
async fn secure_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// The session of the request, or a one-line refusal; a POST must carry
/// the session's CSRF value too.
async fn require_session(State(d): State<Arc<Dashboard>>, mut request: HttpRequest, next: Next) -> Response {
    let Some(session) = d.session(request.headers()) else {
        return (StatusCode::UNAUTHORIZED, Json(ApiError::Unauthorized("not logged in: open /ui and log in".into())))
            .into_response();
    };
    if request.method() == axum::http::Method::POST {
        let given = request.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !crate::authority::token::matches(given, &session.csrf) {
            let e = ApiError::Unauthorized(format!("the request lacks the page's {CSRF_HEADER} header"));
            return (StatusCode::FORBIDDEN, Json(e)).into_response();
        }
    }
    request.extensions_mut().insert(session);
    next.run(request).await
}

/// The page if logged in, else the login form.
async fn index(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    let Some(session) = d.session(&headers) else {
        return Html(render::login(&d.host, None)).into_response();
    };
    d.watch_cluster();
    let view = d.view.borrow().clone();
    Html(render::page(&d.host, &session.csrf, &view, &d.jobs_html())).into_response()
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(d): State<Arc<Dashboard>>,
    form: Result<axum::Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let refuse = |status, why: &str| (status, Html(render::login(&d.host, Some(why)))).into_response();
    let Ok(axum::Form(form)) = form else {
        return refuse(StatusCode::BAD_REQUEST, "the form was not sent whole: try again");
    };
    if !crate::authority::token::matches(form.token.trim(), &d.credentials.token) {
        return refuse(StatusCode::UNAUTHORIZED, "wrong token: it is not this cluster's API token");
    }
    let session = match d.open_session() {
        Ok(s) => s,
        Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    // Secure: the page is only ever served over HTTPS, and the cookie must
    // never travel without it.
    let cookie = format!(
        "{COOKIE}={}; Path=/ui; Secure; HttpOnly; SameSite=Strict; Max-Age={}",
        session.secret,
        SESSION_LIFE.as_secs()
    );
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, "/ui")]).into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

async fn logout(State(d): State<Arc<Dashboard>>, Extension(session): Extension<Session>) -> Response {
    d.sessions.lock().unwrap_or_else(|e| e.into_inner()).retain(|s| s.secret != session.secret);
    let gone = format!("{COOKIE}=; Path=/ui; Secure; HttpOnly; SameSite=Strict; Max-Age=0");
    let mut r = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&gone) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// The page's live feed, server-sent events: `view` (the cluster's HTML,
/// at each look), `jobs` (the actions' panel, when one starts or ends and
/// at each look), `event` (a timeline row per event of the log, its id the
/// event's, so a reconnecting page resumes after the last it got).
async fn stream(
    State(d): State<Arc<Dashboard>>,
    axum::extract::ConnectInfo(client): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let held = d.feeds.take(client.ip()).ok_or_else(|| {
        ApiError::Unavailable(format!(
            "too many pages open ({FEEDS} in all, {FEEDS_PER_SOURCE} from one address): try again later"
        ))
    })?;
    let cluster = d.cluster().await?;
    d.watch_cluster();
    let resumed: i64 =
        headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    let mut views = d.view.subscribe();
    views.mark_changed();
    let mut jobs = d.jobs_changed.subscribe();
    struct Feed {
        views: tokio::sync::watch::Receiver<Arc<String>>,
        jobs: tokio::sync::watch::Receiver<u64>,
        cursor: Cursor,
        story: Story,
        resumed: i64,
        pending: VecDeque<Event>,
        d: Arc<Dashboard>,
        first_read: bool,
        /// Its place among the feeds, given back when the page goes.
        _held: crate::agent::https::Held,
    }
    jobs.mark_unchanged();
    let feed = Feed {
        views,
        jobs,
        cursor: Cursor::default(),
        story: Story::default(),
        resumed,
        pending: VecDeque::new(),
        d,
        first_read: true,
        _held: held,
    };
    let stream = futures_util::stream::unfold(feed, move |mut f| async move {
        loop {
            if let Some(e) = f.pending.pop_front() {
                return Some((Ok::<_, std::convert::Infallible>(e), f));
            }
            // The log is read at once the first time, then every POLL.
            let wait = if f.first_read { Duration::ZERO } else { crate::control::events::POLL };
            tokio::select! {
                changed = f.views.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    let html = f.views.borrow_and_update().clone();
                    f.pending.push_back(Event::default().event("view").data(html.as_str()));
                    f.pending.push_back(Event::default().event("jobs").data(f.d.jobs_html()));
                }
                changed = f.jobs.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    f.jobs.borrow_and_update();
                    f.pending.push_back(Event::default().event("jobs").data(f.d.jobs_html()));
                }
                _ = tokio::time::sleep(wait) => {
                    f.first_read = false;
                    let mut cursor = f.cursor.clone();
                    let read = tokio::task::spawn_blocking(move || {
                        let r = cursor.next(cluster.store());
                        (cursor, r)
                    })
                    .await;
                    // etcd away: the feed waits for it (kept alive meanwhile).
                    if let Ok((cursor, Ok(events))) = read {
                        f.cursor = cursor;
                        for e in events {
                            let meaning = f.story.read(&e);
                            if e.id > f.resumed {
                                f.pending.push_back(timeline_event(&e, meaning));
                            }
                        }
                    }
                }
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

fn timeline_event(e: &ClusterEvent, meaning: Option<crate::control::events::Meaning>) -> Event {
    Event::default().event("event").id(e.id.to_string()).data(render::event_row(e, meaning))
}

/// A VM's console in the page: a WebSocket, relayed to the console of
/// the VM's live side (see the module's doc). Refused before the upgrade
/// (no login: 401; another site's page: 403; not a WebSocket: 400); after
/// it, a failure to attach is the page's first message,
/// `{"error": "..."}`, and the socket closes.
async fn console(
    State(d): State<Arc<Dashboard>>,
    Extension(session): Extension<Session>,
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: HeaderMap,
    upgrade: Result<axum::extract::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    crate::model::check_vm_name(&name)?;
    // A browser says which page opens a WebSocket, and no page of another
    // site can say this agent's.
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()).unwrap_or("");
    if host.is_empty() || origin != format!("https://{host}") {
        let e = ApiError::Unauthorized("a console is opened only by this agent's own page".into());
        return Ok((StatusCode::FORBIDDEN, Json(e)).into_response());
    }
    let upgrade = upgrade
        .map_err(|e| ApiError::BadRequest(format!("the console is a WebSocket: {}", e.body_text().to_lowercase())))?;
    let seat =
        d.consoles.clone().try_acquire_owned().map_err(|_| {
            ApiError::Unavailable(format!("{CONSOLES} consoles are open on this agent's pages: close one"))
        })?;
    Ok(crate::console::limits(upgrade).on_upgrade(move |ws| async move {
        page_console(d, session.csrf, name, ws).await;
        drop(seat);
    }))
}

/// A page's console once upgraded: its CSRF value, then the VM's console
/// found and relayed. The page types if nobody else does, else watches.
async fn page_console(d: Arc<Dashboard>, csrf: String, name: String, mut ws: axum::extract::ws::WebSocket) {
    use axum::extract::ws::{close_code, CloseFrame, Message};
    let first = tokio::time::timeout(CSRF_WITHIN, ws.recv()).await;
    if !matches!(&first, Ok(Some(Ok(Message::Text(t)))) if crate::authority::token::matches(t.as_str(), &csrf)) {
        let close = CloseFrame { code: close_code::POLICY, reason: "the page's CSRF value did not come first".into() };
        let _ = ws.send(Message::Close(Some(close))).await;
        return;
    }
    let opened = async {
        let cluster = d.cluster().await.map_err(|e| e.to_string())?;
        let hosts = tokio::task::spawn_blocking(move || cluster.hosts())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let open = |read_only| crate::console::open(&hosts, &d.credentials, &name, read_only);
        match open(false).await {
            Err(crate::console::ConsoleError::Api(ApiError::Conflict(_))) => open(true).await,
            other => other,
        }
        .map_err(|e| e.to_string())
    };
    match opened.await {
        Ok((upstream, attached)) => {
            let said = serde_json::to_string(&attached).expect("an attachment serializes");
            if ws.send(Message::Text(said.into())).await.is_ok() {
                crate::console::relay(ws, upstream).await;
            }
        }
        Err(e) => {
            let said = serde_json::json!({ "error": e }).to_string();
            let _ = ws.send(Message::Text(said.into())).await;
            let _ = ws.send(Message::Close(None)).await;
        }
    }
}

/// An action the page asks for.
#[derive(Debug, serde::Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
enum Action {
    /// A new VM, as `ftvm cluster vm create` makes one; with a host, there.
    Create {
        spec: crate::model::VmSpec,
        #[serde(default)]
        host: Option<String>,
    },
    /// Keep the VM protected; with a host, its backup there now.
    Protect {
        vm: String,
        host: Option<String>,
    },
    Handover {
        vm: String,
    },
    MoveBackup {
        vm: String,
        host: String,
    },
    Move {
        vm: String,
        host: String,
    },
    Drain {
        host: String,
    },
    Undrain {
        host: String,
    },
}

impl Action {
    fn words(&self) -> String {
        match self {
            Action::Create { spec, host: Some(h) } => format!("create {} on {h}", spec.name),
            Action::Create { spec, host: None } => format!("create {}", spec.name),
            Action::Protect { vm, host: Some(h) } => format!("protect {vm} with a backup on {h}"),
            Action::Protect { vm, host: None } => format!("protect {vm}"),
            Action::Handover { vm } => format!("hand {vm} over to its backup"),
            Action::MoveBackup { vm, host } => format!("move {vm}'s backup to {host}"),
            Action::Move { vm, host } => format!("move {vm} to {host}"),
            Action::Drain { host } => format!("drain {host}"),
            Action::Undrain { host } => format!("undrain {host}"),
        }
    }

    /// Whether its names can be names at all (checked before anything
    /// runs: the page is outside input).
    fn check(&self) -> Result<(), ApiError> {
        let (vm, host) = match self {
            Action::Create { spec, host } => {
                spec.check()?;
                (Some(&spec.name), host.as_ref())
            }
            Action::Protect { vm, host } => (Some(vm), host.as_ref()),
            Action::Handover { vm } => (Some(vm), None),
            Action::MoveBackup { vm, host } | Action::Move { vm, host } => (Some(vm), Some(host)),
            Action::Drain { host } | Action::Undrain { host } => (None, Some(host)),
        };
        if let Some(vm) = vm.filter(|v| !ftvm_etcd::arbiter::valid_vm_name(v)) {
            return Err(ApiError::BadRequest(format!("{vm:?} is not a VM name")));
        }
        if let Some(host) = host.filter(|h| h.is_empty() || h.len() > 64 || h.contains('/')) {
            return Err(ApiError::BadRequest(format!("{host:?} is not a host's id")));
        }
        Ok(())
    }

    /// Does it, through the operations `ftvm cluster` uses. Blocking.
    fn run(self, cluster: &Cluster) -> Result<String, OpsError> {
        Ok(match self {
            Action::Create { spec, host } => {
                let name = spec.name.clone();
                cluster.create(spec, host.as_deref())?;
                let side = cluster.wait_running(&name, CREATED_WITHIN)?;
                format!("{name} created on {}", side.host.id)
            }
            Action::Protect { vm, host } => {
                let mode = cluster.protection_mode(&vm)?;
                cluster.protect(&vm, host.as_deref(), mode)?.message
            }
            Action::Handover { vm } => cluster.handover(&vm)?.message,
            Action::MoveBackup { vm, host } => {
                let mode = cluster.protection_mode(&vm)?;
                cluster.move_backup(&vm, &host, mode)?.message
            }
            Action::Move { vm, host } => cluster.move_to(&vm, &host)?.message,
            Action::Drain { host } => {
                cluster.drain(&host, true)?;
                cluster.wait_drained(&host, DRAIN_WITHIN)?;
                format!("host {host} is drained: it runs no VM")
            }
            Action::Undrain { host } => {
                cluster.drain(&host, false)?;
                format!("host {host} is in use again")
            }
        })
    }
}

/// What `POST /ui/actions` answers: the job it started.
#[derive(Debug, serde::Serialize)]
struct Started {
    job: u64,
    what: String,
}

async fn act(State(d): State<Arc<Dashboard>>, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let mut action: Action =
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("the request's body: {e}")))?;
    // The page's host choice "" is "the controller chooses".
    if let Action::Protect { host, .. } | Action::Create { host, .. } = &mut action {
        if host.as_deref() == Some("") {
            *host = None;
        }
    }
    action.check()?;
    let cluster = d.cluster().await?;
    let what = action.words();
    let id = {
        let mut jobs = d.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.iter().filter(|j| j.result.is_none()).count() >= JOBS_RUNNING {
            return Err(ApiError::Conflict(format!("{JOBS_RUNNING} actions run already: wait for one to end")));
        }
        let id = d.next_job.fetch_add(1, Ordering::Relaxed);
        jobs.push_back(Job {
            id,
            what: what.clone(),
            started_ms: view::now_ms(),
            started: Instant::now(),
            result: None,
        });
        while jobs.len() > JOBS_SHOWN {
            match jobs.iter().position(|j| j.result.is_some()) {
                Some(i) => {
                    jobs.remove(i);
                }
                None => break,
            }
        }
        id
    };
    d.jobs_changed.send_modify(|n| *n += 1);
    let dash = d.clone();
    tokio::spawn(async move {
        let result = match tokio::task::spawn_blocking(move || action.run(cluster)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("the action failed: {e}")),
        };
        if let Some(j) = dash.jobs.lock().unwrap_or_else(|e| e.into_inner()).iter_mut().find(|j| j.id == id) {
            j.result = Some(result);
        }
        dash.jobs_changed.send_modify(|n| *n += 1);
    });
    Ok((StatusCode::ACCEPTED, Json(Started { job: id, what })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; ftvm_session=abc; b=2"));
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
    }

    #[test]
    fn an_action_is_typed_and_its_names_checked() {
        let a: Action = serde_json::from_str(r#"{"action": "move_backup", "vm": "redis", "host": "spare"}"#).unwrap();
        assert_eq!(a.words(), "move redis's backup to spare");
        assert!(a.check().is_ok());
        let bad: Action = serde_json::from_str(r#"{"action": "handover", "vm": "../x"}"#).unwrap();
        assert!(matches!(bad.check(), Err(ApiError::BadRequest(_))));
        assert!(serde_json::from_str::<Action>(r#"{"action": "format_disks"}"#).is_err());
        let create = r#"{"action": "create", "host": "h2", "spec": {"name": "db", "image": "web", "memory_mib": 1024,
            "protect": "checkpoint", "network": {"bridge": "br0", "ip": "10.0.0.5/24"}}}"#;
        let a: Action = serde_json::from_str(create).unwrap();
        assert_eq!(a.words(), "create db on h2");
        assert!(a.check().is_ok());
        let bad = r#"{"action": "create", "spec": {"name": "db", "network": {"bridge": "b;id", "ip": "10.0.0.5/24"}}}"#;
        let a: Action = serde_json::from_str(bad).unwrap();
        assert!(matches!(a.check(), Err(ApiError::BadRequest(m)) if m.contains("bridge")));
    }

    #[test]
    fn sessions_are_bounded_and_found_by_their_secret() {
        let credentials = crate::authority::credentials::scratch("sessions");
        let d = Dashboard::new("h", credentials.etcd("https://127.0.0.1:2379").unwrap(), credentials);
        let mut first = None;
        for _ in 0..MAX_SESSIONS + 3 {
            let s = d.open_session().unwrap();
            first.get_or_insert(s.secret.clone());
        }
        assert_eq!(d.sessions.lock().unwrap().len(), MAX_SESSIONS);
        let last = d.sessions.lock().unwrap().last().unwrap().secret.clone();
        let with = |s: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::COOKIE, HeaderValue::from_str(&format!("{COOKIE}={s}")).unwrap());
            h
        };
        assert!(d.session(&with(&last)).is_some());
        assert!(d.session(&with(&first.unwrap())).is_none(), "the oldest session went");
        assert!(d.session(&with("nope")).is_none());
    }
}
