//! The names models are served under, as vLLM's `OpenAIServingModels` keeps them: every name
//! of `--served-model-name` is accepted in requests, the first is the `model` of responses,
//! `/v1/models` lists a card per name, and each card's `root` is the model as it was given
//! (the hub id, or the path as written), not the folder it resolved to.

use std::collections::HashMap;

/// One served model's names and what it was given as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedModel {
    /// The first is the name responses carry.
    pub names: Vec<String>,
    /// The model as given on the command line (or the default model's hub id).
    pub given: String,
}

/// Pair the models given with `--served-model-name`'s names: with one model every name is
/// one of its names (vLLM's `nargs='+'`); with several, one name each, in order (this server
/// serves several models in one process); without names, each model is served under the
/// name it was given as.
pub fn pair(given: &[String], names: &[String]) -> Result<Vec<ServedModel>, String> {
    let models: Vec<ServedModel> = match (given.len(), names.len()) {
        (_, 0) => given
            .iter()
            .map(|g| ServedModel {
                names: vec![g.clone()],
                given: g.clone(),
            })
            .collect(),
        (1, _) => vec![ServedModel {
            names: names.to_vec(),
            given: given[0].clone(),
        }],
        (models, count) if models == count => given
            .iter()
            .zip(names)
            .map(|(g, n)| ServedModel {
                names: vec![n.clone()],
                given: g.clone(),
            })
            .collect(),
        (models, count) => {
            return Err(format!(
                "--served-model-name gives {count} name(s) for {models} model(s): give one name \
                 per model (several names are aliases only when one model is served)"
            ))
        }
    };
    let mut seen = std::collections::HashSet::new();
    for name in models.iter().flat_map(|m| &m.names) {
        if !seen.insert(name) {
            return Err(format!(
                "the name {name} is given to two models (or twice): use --served-model-name"
            ));
        }
    }
    Ok(models)
}

/// Every served name and the model it stands for.
#[derive(Debug, Default)]
pub struct ServedNames {
    models: Vec<ServedModel>,
    /// Each name to its model's place in `models`.
    by_name: HashMap<String, usize>,
}

impl ServedNames {
    pub fn new(models: Vec<ServedModel>) -> Self {
        let by_name = models
            .iter()
            .enumerate()
            .flat_map(|(i, m)| m.names.iter().map(move |n| (n.clone(), i)))
            .collect();
        Self { models, by_name }
    }

    /// The name the engine serves `name`'s model under (its first); `None` for an unknown
    /// name.
    pub fn primary(&self, name: &str) -> Option<&str> {
        let model = &self.models[*self.by_name.get(name)?];
        model.names.first().map(String::as_str)
    }

    /// The model whose first name is `primary`.
    pub fn model(&self, primary: &str) -> Option<&ServedModel> {
        self.by_name
            .get(primary)
            .map(|&i| &self.models[i])
            .filter(|m| m.names.first().is_some_and(|n| n == primary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_model_takes_every_name_and_several_take_one_each() {
        let one = pair(&strings(&["org/m"]), &strings(&["a", "b"])).unwrap_or_default();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].names, strings(&["a", "b"]));
        let names = ServedNames::new(one);
        assert_eq!(names.primary("b"), Some("a"));
        assert_eq!(names.primary("c"), None);
        assert_eq!(names.model("a").map(|m| m.given.as_str()), Some("org/m"));
        assert!(names.model("b").is_none());

        let two = pair(&strings(&["x", "y"]), &strings(&["a", "b"])).unwrap_or_default();
        assert_eq!(two[1].names, strings(&["b"]));
        assert!(pair(&strings(&["x", "y"]), &strings(&["a"])).is_err());
        assert!(pair(&strings(&["x"]), &strings(&["a", "a"])).is_err());
        let unnamed = pair(&strings(&["x", "./y"]), &[]).unwrap_or_default();
        assert_eq!(unnamed[1].names, strings(&["./y"]));
    }
}
