//! A local stand-in for Azure: the Resource Manager gallery API (galleries, image definitions,
//! image versions, and the VMs, scale sets and disks that consume them) and the page-blob subset of
//! Blob storage, faithful enough that the Azure SDKs (ours in Rust, Microsoft's in Python) work.
//!
//! ARM and blob run on two listeners, like real Azure (the blob one is path-style, like Azurite:
//! `http://HOST:PORT/devstoreaccount1/...`). Both share one in-memory state behind a mutex, optionally
//! persisted to a JSON file. `/_emulator/` (on either port) offers the request log, counters, fault
//! injection, a clock offset for lease expiry, and the world (consumer resources).
//!
//! This module never links to the domain (gallery, stemcell) nor to the tool's settings: it is
//! Azure's side of the wire, and the only thing of the crate outside it that it uses is
//! [`crate::devstore`] (the development account, key and token).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::task::JoinHandle;

mod admin;
mod arm;
mod blob;
mod net;
mod role;
pub mod store;
pub mod timing;
mod world;

pub use admin::{glob_match, Fault, FiredFault, LoggedRequest};
pub use role::Role;
pub use timing::{Profile as TimingProfile, Timing};
pub use world::World;

use store::Data;

/// How to run the emulator.
#[derive(Debug, Clone)]
pub struct Options {
    /// Address of the ARM listener (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Address of the blob listener; default: the ARM listener's IP with port 0.
    pub blob_listen: Option<SocketAddr>,
    /// Persist the state to this JSON file (loaded at start when it exists, written on change).
    pub state_file: Option<PathBuf>,
    /// Resources to seed (consumers: VMs, scale sets and their instances, disks; optionally
    /// gallery resources). See [`World`].
    pub world: Option<World>,
    /// How many status polls (GETs of the resource or of its operation) a PUT/PATCH/DELETE of a
    /// gallery resource takes to complete.
    pub polls_to_complete: u32,
    /// Items per page of ARM lists (before `nextLink`) and the default for blob lists.
    pub page_size: usize,
    /// Seconds in the `Retry-After` header of long-running operations.
    pub retry_after: u32,
    /// An operation nobody polls still completes this long after it started (like Azure, which
    /// does not wait for clients), noticed at the next request touching the resource.
    pub complete_after: Duration,
    /// Hold the tool's identity to this role (see [`Role`]): requests outside it get 403.
    pub role: Option<Role>,
    /// Durations and rates (see [`Timing`]): instant by default, or Azure's recorded ones
    /// scaled (`--timing azure --time-scale N`).
    pub timing: Timing,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            blob_listen: None,
            state_file: None,
            world: None,
            polls_to_complete: 1,
            page_size: 100,
            retry_after: 0,
            complete_after: Duration::from_secs(10),
            role: None,
            timing: Timing::instant(),
        }
    }
}

/// The emulator's shared state; cheap to clone.
#[derive(Clone)]
pub struct State(Arc<Shared>);

pub(crate) struct Shared {
    data: Mutex<Data>,
    log: Mutex<admin::Log>,
    faults: Mutex<Vec<Fault>>,
    timing: Mutex<Timing>,
    /// Per page blob (`container/blob`): when its throttle is free for the next request, in
    /// milliseconds since `started` (see [`timing::admit`]).
    throttle: Mutex<std::collections::HashMap<String, f64>>,
    started: std::time::Instant,
    polls_to_complete: u32,
    page_size: usize,
    retry_after: u32,
    complete_after: Duration,
    role: Option<Role>,
    /// Seconds added to the wall clock (admin `POST /_emulator/clock`), for lease expiry tests.
    clock_offset: AtomicI64,
    persist: Option<Persist>,
    /// `host:port` of this emulator's blob endpoint(s), to recognise its own source blobs.
    blob_hosts: Mutex<Vec<String>>,
}

struct Persist {
    path: PathBuf,
    dirty: AtomicBool,
    notify: tokio::sync::Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    /// Build the state: load `state_file` when it exists, then seed `world`.
    pub fn new(opts: &Options) -> anyhow::Result<State> {
        let mut data = match &opts.state_file {
            Some(path) if path.exists() => {
                let text = std::fs::read(path)
                    .with_context(|| format!("cannot read the state file {}", path.display()))?;
                serde_json::from_slice::<Data>(&text).with_context(|| {
                    format!(
                        "the state file {} is not an emulator state document; move it away to start empty",
                        path.display()
                    )
                })?
            }
            _ => Data::default(),
        };
        if let Some(world) = &opts.world {
            world.apply(&mut data, false)?;
        }
        if opts.page_size == 0 {
            anyhow::bail!("the emulator page size must be at least 1");
        }
        Ok(State(Arc::new(Shared {
            data: Mutex::new(data),
            log: Mutex::new(admin::Log::default()),
            faults: Mutex::new(Vec::new()),
            timing: Mutex::new(opts.timing),
            throttle: Mutex::new(Default::default()),
            started: std::time::Instant::now(),
            polls_to_complete: opts.polls_to_complete,
            page_size: opts.page_size,
            retry_after: opts.retry_after,
            complete_after: opts.complete_after,
            role: opts.role.clone(),
            clock_offset: AtomicI64::new(0),
            blob_hosts: Mutex::new(Vec::new()),
            persist: opts.state_file.clone().map(|path| Persist {
                path,
                dirty: AtomicBool::new(false),
                notify: tokio::sync::Notify::new(),
            }),
        })))
    }

    pub(crate) fn data(&self) -> MutexGuard<'_, Data> {
        lock(&self.0.data)
    }

    /// Record that the persistent state changed (the persister writes it soon).
    pub(crate) fn changed(&self) {
        if let Some(p) = &self.0.persist {
            p.dirty.store(true, Ordering::SeqCst);
            p.notify.notify_one();
        }
    }

    /// Write the state file now if something changed since the last write.
    pub fn flush(&self) -> anyhow::Result<()> {
        let Some(p) = &self.0.persist else {
            return Ok(());
        };
        if !p.dirty.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        let bytes = serde_json::to_vec(&*self.data())?;
        write_atomically(&p.path, &bytes)
    }

    /// The durations and rates in force (`Options::timing`, replaced by `PUT /_emulator/timing`).
    pub fn timing(&self) -> Timing {
        *lock(&self.0.timing)
    }

    /// Take a page blob write of `bytes` through that blob's throttle: `Ok(wait)` to serve it
    /// after `wait`, or the 503 refusal when it is beyond the targets.
    pub(crate) fn admit_page_write(
        &self,
        blob: &str,
        bytes: u64,
    ) -> Result<Duration, timing::Admit> {
        let t = self.timing();
        if !t.throttles() {
            return Ok(Duration::ZERO);
        }
        let now = self.0.started.elapsed().as_secs_f64() * 1000.0;
        let mut map = lock(&self.0.throttle);
        let free = map.entry(blob.to_string()).or_insert(0.0);
        match timing::admit(&t, free, now, bytes) {
            timing::Admit::After(ms) => Ok(Duration::from_millis(ms)),
            refused => Err(refused),
        }
    }

    /// Unix seconds, including the admin clock offset.
    pub(crate) fn now(&self) -> i64 {
        time::OffsetDateTime::now_utc().unix_timestamp()
            + self.0.clock_offset.load(Ordering::SeqCst)
    }

    pub(crate) fn now_dt(&self) -> time::OffsetDateTime {
        time::OffsetDateTime::now_utc()
            + time::Duration::seconds(self.0.clock_offset.load(Ordering::SeqCst))
    }

    /// The requests served so far (admin routes excluded), oldest first.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        lock(&self.0.log).requests.clone()
    }

    /// Clear the request log and counters (the state stays).
    pub fn reset_log(&self) {
        *lock(&self.0.log) = admin::Log::default();
    }

    /// Create a gallery (Succeeded) unless it exists; for `--emulator` and tests.
    pub fn ensure_gallery(
        &self,
        subscription: &str,
        resource_group: &str,
        gallery: &str,
        location: &str,
    ) -> anyhow::Result<()> {
        let id = format!(
            "/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Compute/galleries/{gallery}"
        );
        let world = World {
            resources: vec![serde_json::json!({
                "id": id,
                "location": location,
                "properties": {"identifier": {"uniqueName": format!("{}-{}", subscription.to_uppercase(), gallery.to_uppercase())}},
            })],
        };
        let exists = self.data().resources.contains_key(&id.to_lowercase());
        if !exists {
            world
                .apply(&mut self.data(), false)
                .with_context(|| format!("cannot create the gallery {gallery} in the emulator"))?;
            self.changed();
        }
        Ok(())
    }

    /// Create a blob container unless it exists; for `--emulator` and tests.
    pub fn ensure_container(&self, name: &str) -> anyhow::Result<()> {
        if !blob::valid_container_name(name) {
            anyhow::bail!("{name:?} is not a valid blob container name (3-63 lowercase letters, digits, dashes)");
        }
        let now = self.now();
        self.data()
            .containers
            .entry(name.to_string())
            .or_insert_with(|| store::Container {
                name: name.to_string(),
                metadata: Default::default(),
                etag: format!("\"0x8D{:012X}\"", now),
                last_modified: now,
                blobs: Default::default(),
            });
        self.changed();
        Ok(())
    }

    /// Queue a fault for the next matching requests.
    pub fn add_fault(&self, fault: Fault) {
        lock(&self.0.faults).push(fault);
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state".into());
    let tmp = match dir {
        Some(d) => d.join(format!(".{file_name}.tmp-{}", std::process::id())),
        None => PathBuf::from(format!(".{file_name}.tmp-{}", std::process::id())),
    };
    std::fs::write(&tmp, bytes)
        .with_context(|| format!("cannot write the state file {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot replace the state file {}", path.display()))?;
    Ok(())
}

/// The emulator's router: ARM (`/subscriptions/...`), blob (`/devstoreaccount1/...`) and admin
/// (`/_emulator/...`) routes. Both listeners serve it.
pub fn app(state: State) -> Router {
    Router::new()
        .route("/_emulator/requests", get(admin::requests))
        .route("/_emulator/counters", get(admin::counters))
        .route("/_emulator/reset", post(admin::reset))
        .route(
            "/_emulator/faults",
            post(admin::add_fault)
                .delete(admin::clear_faults)
                .get(admin::list_faults),
        )
        .route(
            "/_emulator/world",
            get(admin::get_world).put(admin::put_world),
        )
        .route("/_emulator/clock", post(admin::advance_clock))
        .route(
            "/_emulator/timing",
            get(admin::get_timing).put(admin::put_timing),
        )
        .fallback(serve_azure)
        .layer(axum::middleware::from_fn_with_state(state.clone(), front))
        .with_state(state)
}

async fn serve_azure(
    axum::extract::State(state): axum::extract::State<State>,
    req: Request,
) -> Response {
    if blob::is_blob_path(req.uri().path()) {
        blob::handle(state, req).await
    } else {
        arm::handle(state, req).await
    }
}

/// Front middleware for Azure routes: faults first, then the handler, then the log.
async fn front(
    axum::extract::State(state): axum::extract::State<State>,
    req: Request,
    next: Next,
) -> Response {
    let req = blob::host_style_to_path_style(req);
    let path = req.uri().path().to_string();
    if path.starts_with("/_emulator/") || path == "/_emulator" {
        return next.run(req).await;
    }
    let method = req.method().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let conn = req.extensions().get::<ConnectInfo<net::Conn>>().cloned();
    let port = conn.as_ref().map(|c| c.0.local_port);
    let service = if blob::is_blob_path(&path) {
        "blob"
    } else {
        "arm"
    };
    let route = if service == "blob" {
        format!("{method} {}", blob::route_template(&path, &query))
    } else {
        format!("{method} {}", arm::route_template(&path))
    };

    let fault = admin::take_fault(&state, &method, &path, &query);
    let response = match fault {
        Some(f) => {
            let conn = conn.as_ref().map(|c| &c.0);
            match admin::serve_with_fault(&state, &f, conn, service, req, next).await {
                Ok(r) => r,
                Err(admin::Dropped) => {
                    admin::record(&state, &method, &path, &query, 0, service, port, &route);
                    return StatusCode::INTERNAL_SERVER_ERROR.into_response();
                }
            }
        }
        None => serve_in_role(&state, req, next).await,
    };
    let mut response = response;
    // Azure stamps every answer with `Date` (RFC 9110 §6.6.1; every response of the recorded SDK
    // sessions carries one), from its own clock: ours, movable by `POST /_emulator/clock`, so a
    // test can put Azure's clock and the host's apart (hyper would otherwise add the host's).
    if let Ok(v) = http::HeaderValue::from_str(&http_date(state.now_dt())) {
        response.headers_mut().insert(http::header::DATE, v);
    }
    admin::record(
        &state,
        &method,
        &path,
        &query,
        response.status().as_u16(),
        service,
        port,
        &route,
    );
    response
}

/// An HTTP date (IMF-fixdate, RFC 9110 §5.6.7): `Tue, 01 Dec 2026 08:22:08 GMT`.
pub(crate) fn http_date(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    t.format(time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    ))
    .unwrap_or_default()
}

/// Serve the request, unless the role (when one is enforced) does not allow it.
/// Serve a request as the configured role allows (faults are applied before this).
pub(crate) async fn serve_in_role(state: &State, req: Request, next: Next) -> Response {
    if req.method() == axum::http::Method::GET {
        if let Some(answer) =
            role::permissions(state.0.role.as_ref(), req.uri().path(), req.headers())
        {
            return answer;
        }
    }
    let Some(role) = &state.0.role else {
        return next.run(req).await;
    };
    let uri = req.uri();
    if let Some(denied) = role::deny(
        role,
        req.method(),
        uri.path(),
        uri.query().unwrap_or_default(),
        req.headers(),
    ) {
        return denied;
    }
    let filter = role::list_filter(role, req.method(), uri.path(), req.headers());
    let response = next.run(req).await;
    match filter {
        Some(scopes) if response.status().is_success() => filtered(response, &scopes).await,
        _ => response,
    }
}

/// A list answered as Azure answers an identity that may read only part of its scope: the same
/// page with the items it may not read left out (pages may come back short, even empty).
async fn filtered(response: Response, scopes: &[String]) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let Ok(mut doc) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    role::filter_list_body(&mut doc, scopes);
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(doc.to_string()))
}

use axum::http::StatusCode;

/// A running emulator. Dropping it (or [`Handle::shutdown`]) stops both listeners and writes the
/// state file.
pub struct Handle {
    /// ARM endpoint, e.g. `http://127.0.0.1:PORT`.
    pub arm: String,
    /// Blob account URL, e.g. `http://127.0.0.1:PORT2/devstoreaccount1`.
    pub blob: String,
    pub arm_addr: SocketAddr,
    pub blob_addr: SocketAddr,
    pub state: State,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Handle {
    /// Stop serving (in-flight requests finish, idle connections close) and flush the state file.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        for task in std::mem::take(&mut self.tasks) {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        self.state.flush()
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
        if let Err(err) = self.state.flush() {
            tracing::warn!("emulator state not saved: {err:#}");
        }
    }
}

/// Bind both listeners and serve in background tasks of the current tokio runtime.
pub async fn start(opts: Options) -> anyhow::Result<Handle> {
    let state = State::new(&opts)?;
    let arm_listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("cannot listen on {} for the ARM endpoint", opts.listen))?;
    let blob_bind = opts
        .blob_listen
        .unwrap_or_else(|| SocketAddr::new(opts.listen.ip(), 0));
    let blob_listener = tokio::net::TcpListener::bind(blob_bind)
        .await
        .with_context(|| format!("cannot listen on {blob_bind} for the blob endpoint"))?;
    let arm_addr = arm_listener.local_addr()?;
    let blob_addr = blob_listener.local_addr()?;
    {
        let mut hosts = lock(&state.0.blob_hosts);
        for name in ["127.0.0.1", "localhost"] {
            hosts.push(format!("{name}:{}", blob_addr.port()));
        }
        hosts.push(format!("{}:{}", blob_addr.ip(), blob_addr.port()));
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for listener in [arm_listener, blob_listener] {
        let router = app(state.clone());
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let service = router.into_make_service_with_connect_info::<net::Conn>();
            let result = axum::serve(net::KillableListener::new(listener), service)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(err) = result {
                tracing::error!("emulator listener stopped: {err}");
            }
        }));
    }
    if state.0.persist.is_some() {
        let st = state.clone();
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let notified = async {
                    if let Some(p) = &st.0.persist {
                        p.notify.notified().await;
                    }
                };
                tokio::select! {
                    _ = notified => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
                // Coalesce bursts (e.g. many Put Page calls) into one write.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let st2 = st.clone();
                let res = tokio::task::spawn_blocking(move || st2.flush()).await;
                match res {
                    Ok(Err(err)) => tracing::warn!("emulator state not saved: {err:#}"),
                    Err(err) => tracing::warn!("emulator state writer failed: {err}"),
                    Ok(Ok(())) => {}
                }
            }
        }));
    }
    let host = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
    };
    Ok(Handle {
        arm: format!("http://{}", host(arm_addr)),
        blob: format!(
            "http://{}/{}",
            host(blob_addr),
            crate::devstore::DEV_ACCOUNT
        ),
        arm_addr,
        blob_addr,
        state,
        stop: Some(stop_tx),
        tasks,
    })
}
