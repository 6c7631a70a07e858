//! Model discovery from `GET /v1/models`.
//!
//! Our server lists `tasks` per model; a vLLM server does not, so without it the kind
//! of a model is guessed from its name.

use serde_json::Value;

use crate::config::SuiteConfig;
use crate::http::{Client, RequestSpec};

/// One model card, as far as the suite needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCard {
    pub id: String,
    /// Our `tasks` extension, when the server advertises it.
    pub tasks: Option<Vec<String>>,
    pub max_model_len: Option<u64>,
}

impl ModelCard {
    pub fn from_json(card: &Value) -> Option<Self> {
        let id = card.get("id")?.as_str()?.to_string();
        let tasks = card.get("tasks").and_then(Value::as_array).map(|tasks| {
            tasks
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        });
        Some(Self {
            id,
            tasks,
            max_model_len: card.get("max_model_len").and_then(Value::as_u64),
        })
    }

    fn has_task(&self, task: &str) -> Option<bool> {
        self.tasks
            .as_ref()
            .map(|tasks| tasks.iter().any(|t| t == task))
    }

    /// Whether the model generates text (by `tasks`, else by name).
    pub fn generates(&self) -> bool {
        self.has_task("generate")
            .unwrap_or_else(|| !looks_like_embedding_model(&self.id))
    }

    /// Whether the model embeds (by `tasks`, else by name).
    pub fn embeds(&self) -> bool {
        self.has_task("embed")
            .unwrap_or_else(|| looks_like_embedding_model(&self.id))
    }

    /// Whether the model classifies (only known from `tasks`).
    pub fn classifies(&self) -> bool {
        self.has_task("classify").unwrap_or(false)
    }
}

/// A name-based guess for servers without `tasks`.
pub fn looks_like_embedding_model(id: &str) -> bool {
    let id = id.to_ascii_lowercase();
    [
        "embed",
        "minilm",
        "bge-",
        "/e5-",
        "gte-",
        "sentence-transformers",
        "mpnet",
        "rerank",
        "colbert",
    ]
    .iter()
    .any(|hint| id.contains(hint))
}

/// What discovery found (and the configured overrides).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Models {
    pub cards: Vec<ModelCard>,
    pub chat: Option<String>,
    pub embedding: Option<String>,
    pub classifier: Option<String>,
    /// Why discovery failed, when it did.
    pub error: Option<String>,
}

impl Models {
    /// Picks models from a `/v1/models` body, honouring configured names.
    pub fn from_listing(listing: &Value, cfg: &SuiteConfig) -> Self {
        let cards: Vec<ModelCard> = listing
            .get("data")
            .and_then(Value::as_array)
            .map(|data| data.iter().filter_map(ModelCard::from_json).collect())
            .unwrap_or_default();
        let chat = cfg.chat_model.clone().or_else(|| {
            cards
                .iter()
                .find(|card| card.generates())
                .map(|card| card.id.clone())
        });
        let embedding = cfg.embedding_model.clone().or_else(|| {
            cards
                .iter()
                .find(|card| card.embeds())
                .map(|card| card.id.clone())
        });
        let classifier = cards
            .iter()
            .find(|card| card.classifies())
            .map(|card| card.id.clone());
        let error = if cards.is_empty() {
            Some("GET /v1/models listed no models".to_string())
        } else {
            None
        };
        Self {
            cards,
            chat,
            embedding,
            classifier,
            error,
        }
    }

    /// Only the configured names (discovery failed).
    pub fn configured_only(cfg: &SuiteConfig, error: String) -> Self {
        Self {
            cards: Vec::new(),
            chat: cfg.chat_model.clone(),
            embedding: cfg.embedding_model.clone(),
            classifier: None,
            error: Some(error),
        }
    }

    pub fn card(&self, id: &str) -> Option<&ModelCard> {
        self.cards.iter().find(|card| card.id == id)
    }

    /// `max_model_len` of `id`, when listed.
    pub fn max_model_len(&self, id: &str) -> Option<u64> {
        self.card(id).and_then(|card| card.max_model_len)
    }

    /// A model name guaranteed not to be served.
    pub fn unknown_model_name(&self) -> String {
        let mut name = "contract-no-such-model".to_string();
        while self.card(&name).is_some() {
            name.push('x');
        }
        name
    }
}

/// Lists the server's models.
pub async fn discover(client: &Client, cfg: &SuiteConfig) -> Models {
    match client.send(&RequestSpec::get("/v1/models")).await {
        Ok(reply) if reply.status == 200 => match &reply.json {
            Some(listing) => Models::from_listing(listing, cfg),
            None => Models::configured_only(cfg, "GET /v1/models: body is not JSON".into()),
        },
        Ok(reply) => Models::configured_only(
            cfg,
            format!(
                "GET /v1/models answered {}",
                crate::expect::summarize(&reply)
            ),
        ),
        Err(err) => Models::configured_only(cfg, format!("GET /v1/models: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn picks_models_by_tasks() {
        let listing = json!({"object": "list", "data": [
            {"id": "emb", "object": "model", "tasks": ["embed", "score"], "max_model_len": 256},
            {"id": "gen", "object": "model", "tasks": ["generate"], "max_model_len": 8192},
        ]});
        let models = Models::from_listing(&listing, &SuiteConfig::new("http://x"));
        assert_eq!(models.chat.as_deref(), Some("gen"));
        assert_eq!(models.embedding.as_deref(), Some("emb"));
        assert_eq!(models.classifier, None);
        assert_eq!(models.max_model_len("emb"), Some(256));
        assert_eq!(models.error, None);
    }

    #[test]
    fn guesses_by_name_without_tasks() {
        let listing = json!({"data": [
            {"id": "BAAI/bge-small-en"}, {"id": "meta-llama/Llama-3.2-1B"}
        ]});
        let models = Models::from_listing(&listing, &SuiteConfig::new("http://x"));
        assert_eq!(models.chat.as_deref(), Some("meta-llama/Llama-3.2-1B"));
        assert_eq!(models.embedding.as_deref(), Some("BAAI/bge-small-en"));
    }

    #[test]
    fn configured_names_win() {
        let mut cfg = SuiteConfig::new("http://x");
        cfg.chat_model = Some("mine".into());
        let listing = json!({"data": [{"id": "gen", "tasks": ["generate"]}]});
        let models = Models::from_listing(&listing, &cfg);
        assert_eq!(models.chat.as_deref(), Some("mine"));
        assert!(Models::from_listing(&json!({}), &cfg).error.is_some());
    }

    #[test]
    fn unknown_name_is_not_served() {
        let listing = json!({"data": [{"id": "contract-no-such-model"}]});
        let models = Models::from_listing(&listing, &SuiteConfig::new("http://x"));
        assert_ne!(models.unknown_model_name(), "contract-no-such-model");
    }
}
