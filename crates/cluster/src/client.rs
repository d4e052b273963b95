//! The client of an agent's HTTP API that `ftvm cluster` uses: one
//! blocking call per request, typed both ways ([`crate::model`]), with a
//! deadline, and the agent's refusal returned as its typed error.

use crate::authority::credentials::Credentials;
use crate::model::{ApiError, BackupRequest, BackupStarted, Done, HostRecord, ProtectRequest, VmInfo, VmSpec};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// How long a request may take (a protect or handover waits for the pair).
const DEADLINE: Duration = Duration::from_secs(320);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The agent refused, with its reason.
    #[error("{0}")]
    Api(ApiError),
    /// The agent could not be reached, or broke off.
    #[error("cannot reach the agent at {url}: {problem}")]
    Transport { url: String, problem: String },
    /// The agent's address is not `https://`: the cluster's token is
    /// never sent in clear (a host record in etcd is written by anyone
    /// who holds a cluster certificate; issue 68).
    #[error("refused to call the agent at {url}: not https://, and the cluster's token is never sent in clear")]
    NotHttps { url: String },
    /// The agent answered something that is not the API's.
    #[error("the agent at {url} answered {status} with a body that is not the API's: {problem}")]
    Unreadable { url: String, status: u16, problem: String },
}

/// A client of one agent.
pub struct AgentClient {
    base: String,
    token: String,
    http: ureq::Agent,
}

impl AgentClient {
    /// A client of the agent at `base` (`https://IP:PORT`), with the
    /// cluster's credentials (its token, and its authority as the only one
    /// trusted).
    pub fn new(base: &str, credentials: &Credentials) -> AgentClient {
        AgentClient::with_deadline(base, credentials, DEADLINE)
    }

    /// The same, its requests given up after `deadline` (a look that must
    /// not wait for an agent that hangs).
    pub fn with_deadline(base: &str, credentials: &Credentials, deadline: Duration) -> AgentClient {
        let token = &credentials.token;
        let http: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(credentials.agent_tls())
            .timeout_global(Some(deadline))
            .timeout_connect(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .into();
        AgentClient { base: base.trim_end_matches('/').to_string(), token: token.to_string(), http }
    }

    fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, ClientError> {
        let url = self.url(path)?;
        let auth = format!("Bearer {}", self.token);
        let sent = match (method, body) {
            ("GET", _) => self.http.get(&url).header("Authorization", &auth).call(),
            ("DELETE", _) => self.http.delete(&url).header("Authorization", &auth).call(),
            (_, Some(b)) => self.http.post(&url).header("Authorization", &auth).send_json(&b),
            (_, None) => self.http.post(&url).header("Authorization", &auth).send_empty(),
        };
        let mut response = sent.map_err(|e| ClientError::Transport { url: url.clone(), problem: e.to_string() })?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Transport { url: url.clone(), problem: e.to_string() })?;
        let unreadable =
            |e: serde_json::Error| ClientError::Unreadable { url: url.clone(), status, problem: e.to_string() };
        if (200..300).contains(&status) {
            serde_json::from_str(&text).map_err(unreadable)
        } else {
            Err(ClientError::Api(serde_json::from_str(&text).map_err(unreadable)?))
        }
    }

    /// The URL of `path` on the agent, if it is spoken to over HTTPS: the
    /// TLS under the cluster's authority (the only root trusted) is what
    /// checks the peer holds a certificate for the address.
    fn url(&self, path: &str) -> Result<String, ClientError> {
        let url = format!("{}{path}", self.base);
        if !self.base.starts_with("https://") {
            return Err(ClientError::NotHttps { url });
        }
        Ok(url)
    }

    pub fn host(&self) -> Result<HostRecord, ClientError> {
        self.call("GET", "/v1/host", None)
    }

    /// The metrics, in Prometheus' text format.
    pub fn metrics(&self) -> Result<String, ClientError> {
        let url = self.url("/metrics")?;
        let mut r = self
            .http
            .get(&url)
            .header("Authorization", &format!("Bearer {}", self.token))
            .call()
            .map_err(|e| ClientError::Transport { url: url.clone(), problem: e.to_string() })?;
        let status = r.status().as_u16();
        let text = r
            .body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Transport { url: url.clone(), problem: e.to_string() })?;
        if status != 200 {
            let e: ApiError = serde_json::from_str(&text).map_err(|e| ClientError::Unreadable {
                url,
                status,
                problem: e.to_string(),
            })?;
            return Err(ClientError::Api(e));
        }
        Ok(text)
    }
}

/// What the control plane asks of a host's agent: the calls of its API
/// that read and change the host's VMs. [`AgentClient`] makes them over
/// HTTPS; the controller's tests make them of hosts in memory.
pub trait AgentApi {
    fn vms(&self) -> Result<Vec<VmInfo>, ClientError>;
    fn vm(&self, name: &str) -> Result<VmInfo, ClientError>;
    fn create(&self, spec: &VmSpec) -> Result<VmInfo, ClientError>;
    fn delete(&self, name: &str) -> Result<Done, ClientError>;
    /// Forgets the VM's process on that host only if it has ended.
    fn delete_ended(&self, name: &str) -> Result<Done, ClientError>;
    fn protect(&self, name: &str, req: &ProtectRequest) -> Result<Done, ClientError>;
    fn unprotect(&self, name: &str) -> Result<Done, ClientError>;
    fn handover(&self, name: &str) -> Result<Done, ClientError>;
    fn start_backup(&self, req: &BackupRequest) -> Result<BackupStarted, ClientError>;
}

/// How the control plane reaches each host's agent.
pub trait Agents: Send + Sync {
    /// A client of `host`'s agent whose requests give up after `deadline`
    /// (None: after the longest a protect or handover takes).
    fn agent(&self, host: &HostRecord, deadline: Option<Duration>) -> Box<dyn AgentApi>;
}

/// The agents over HTTPS, spoken to with the cluster's credentials.
pub struct HttpAgents {
    pub credentials: Credentials,
}

impl Agents for HttpAgents {
    fn agent(&self, host: &HostRecord, deadline: Option<Duration>) -> Box<dyn AgentApi> {
        Box::new(AgentClient::with_deadline(&host.api, &self.credentials, deadline.unwrap_or(DEADLINE)))
    }
}

impl AgentApi for AgentClient {
    fn vms(&self) -> Result<Vec<VmInfo>, ClientError> {
        self.call("GET", "/v1/vms", None)
    }

    fn vm(&self, name: &str) -> Result<VmInfo, ClientError> {
        self.call("GET", &format!("/v1/vms/{name}"), None)
    }

    fn create(&self, spec: &VmSpec) -> Result<VmInfo, ClientError> {
        self.call("POST", "/v1/vms", Some(serde_json::to_value(spec).expect("a spec serializes")))
    }

    fn delete(&self, name: &str) -> Result<Done, ClientError> {
        self.call("DELETE", &format!("/v1/vms/{name}"), None)
    }

    fn delete_ended(&self, name: &str) -> Result<Done, ClientError> {
        self.call("DELETE", &format!("/v1/vms/{name}?ended_only=true"), None)
    }

    fn protect(&self, name: &str, req: &ProtectRequest) -> Result<Done, ClientError> {
        self.call("POST", &format!("/v1/vms/{name}/protect"), Some(serde_json::to_value(req).expect("serializes")))
    }

    fn unprotect(&self, name: &str) -> Result<Done, ClientError> {
        self.call("POST", &format!("/v1/vms/{name}/unprotect"), None)
    }

    fn handover(&self, name: &str) -> Result<Done, ClientError> {
        self.call("POST", &format!("/v1/vms/{name}/handover"), None)
    }

    fn start_backup(&self, req: &BackupRequest) -> Result<BackupStarted, ClientError> {
        self.call("POST", "/v1/backups", Some(serde_json::to_value(req).expect("serializes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 68: a host record pointing at `http://` gets no request, so
    /// no token in clear; nothing is connected to.
    #[test]
    fn an_agent_at_an_address_that_is_not_https_is_not_called() {
        let credentials = crate::authority::credentials::scratch("not-https");
        // A listener that would see the request, were one sent.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let client = AgentClient::with_deadline(&base, &credentials, Duration::from_secs(2));
        assert!(matches!(client.vms(), Err(ClientError::NotHttps { .. })));
        assert!(matches!(client.metrics(), Err(ClientError::NotHttps { .. })));
        assert!(listener.accept().is_err(), "something connected to the http:// agent");
    }
}
