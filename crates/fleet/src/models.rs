//! The model names a gateway serves: the configured ones, else those its workers list (each
//! worker's `/v1/models`, read by the health checks), and the LoRA adapters among them. At
//! most [`MAX_LEARNED_NAMES`] of each are learned.

use kvroute_protocol::openai::ModelCard;
use parking_lot::RwLock;

/// At most this many model names and adapter names are learned from workers.
pub const MAX_LEARNED_NAMES: usize = 1024;

/// The served model and adapter names.
pub struct Models {
    /// Names were configured: the workers' lists add none.
    configured: std::sync::atomic::AtomicBool,
    models: RwLock<Vec<String>>,
    adapters: RwLock<Vec<String>>,
}

impl Models {
    /// The names configured (`models`, `lora_adapters`); an empty `models` is learned.
    pub fn new(models: Vec<String>, adapters: Vec<String>) -> Self {
        Self {
            configured: std::sync::atomic::AtomicBool::new(!models.is_empty()),
            models: RwLock::new(models),
            adapters: RwLock::new(adapters),
        }
    }

    /// The model names served: configured, else learned from workers.
    pub fn names(&self) -> Vec<String> {
        self.models.read().clone()
    }

    /// The LoRA adapter names known.
    pub fn adapters(&self) -> Vec<String> {
        self.adapters.read().clone()
    }

    /// Whether `model` is served (always, while nothing is known): a model, or a LoRA
    /// adapter of one.
    pub fn serves(&self, model: &str) -> bool {
        let known = {
            let models = self.models.read();
            models.is_empty() || models.iter().any(|m| m == model)
        };
        known || self.adapter_of(model).is_some()
    }

    /// The LoRA adapter a request's `model` names (configured or listed by a worker): the
    /// adapter's name itself (vLLM), or `base:adapter` (SGLang).
    pub fn adapter_of<'m>(&self, model: &'m str) -> Option<&'m str> {
        let adapters = self.adapters.read();
        let is = |name: &str| adapters.iter().any(|a| a == name);
        if is(model) {
            return Some(model);
        }
        let (_, adapter) = model.rsplit_once(':')?;
        is(adapter).then_some(adapter)
    }

    /// The names configured anew (a reload): `models` (empty: learned from the workers
    /// again) and `adapters` (the workers' own are learned again).
    pub fn reconfigure(&self, models: Vec<String>, adapters: Vec<String>) {
        {
            // The flag with the list, under its lock (`learn` reads the flag under it too).
            let mut m = self.models.write();
            self.configured
                .store(!models.is_empty(), std::sync::atomic::Ordering::Relaxed);
            *m = models;
        }
        *self.adapters.write() = adapters;
    }

    /// Adds the model names a worker listed (when none were configured) and the LoRA
    /// adapters among them (entries with a parent model).
    pub fn learn(&self, cards: &[ModelCard]) {
        let add = |list: &mut Vec<String>, names: &mut dyn Iterator<Item = &String>| {
            for n in names {
                if !list.contains(n) && list.len() < MAX_LEARNED_NAMES {
                    list.push(n.clone());
                }
            }
        };
        {
            // The flag read under the list's lock: a reload sets both under it.
            let mut models = self.models.write();
            if !self.configured.load(std::sync::atomic::Ordering::Relaxed) {
                add(&mut models, &mut cards.iter().map(|c| &c.id));
            }
        }
        add(
            &mut self.adapters.write(),
            &mut cards
                .iter()
                .filter(|c| c.parent.as_ref().is_some_and(|p| *p != c.id))
                .map(|c| &c.id),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(id: &str, parent: Option<&str>) -> ModelCard {
        serde_json::from_value(serde_json::json!({
            "id": id, "object": "model", "created": 0, "owned_by": "x", "parent": parent,
        }))
        .unwrap()
    }

    #[test]
    fn names_are_learned_unless_configured_and_adapters_always() {
        let m = Models::new(Vec::new(), Vec::new());
        assert!(m.serves("anything"), "nothing known: everything served");
        m.learn(&[card("base", None), card("sql", Some("base"))]);
        assert_eq!(m.names(), ["base", "sql"]);
        assert_eq!(m.adapters(), ["sql"]);
        assert!(m.serves("base") && !m.serves("other"));
        assert_eq!(m.adapter_of("base:sql"), Some("sql"));
        assert_eq!(m.adapter_of("base"), None);
        let c = Models::new(vec!["configured".into()], Vec::new());
        c.learn(&[card("base", None), card("sql", Some("base"))]);
        assert_eq!(c.names(), ["configured"]);
        assert!(c.serves("sql"), "an adapter listed by a worker is served");
    }

    #[test]
    fn at_most_the_limit_is_learned() {
        let m = Models::new(Vec::new(), Vec::new());
        let cards: Vec<ModelCard> = (0..MAX_LEARNED_NAMES + 10)
            .map(|i| card(&format!("m{i}"), None))
            .collect();
        m.learn(&cards);
        assert_eq!(m.names().len(), MAX_LEARNED_NAMES);
    }
}
