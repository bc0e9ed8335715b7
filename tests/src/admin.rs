//! The worker's admin API, as an operator calls it.

/// The worker's admin API.
pub struct AdminClient {
    base: String,
    http: reqwest::Client,
}

impl AdminClient {
    pub(crate) fn new(base: String) -> AdminClient {
        AdminClient { base, http: reqwest::Client::new() }
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("admin reachable");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn post(&self, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut req = self.http.post(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("admin reachable");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }
}
