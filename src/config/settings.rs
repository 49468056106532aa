//! `--set KEY=VALUE`: a setting of the TOML file given on the command line, applied before
//! the file is validated, so an override is checked like the file (an unknown key, a bad
//! value or a wrong type is an error naming it). `KEY` is a dotted path (`kafka.bootstrap`,
//! `lease.member`); `VALUE` is a TOML value (`10`, `true`, `"text"`, `[{ id = 1 }]`), and
//! anything that does not parse as one is a string (`127.0.0.1:9092`, `500ms`). An empty
//! value removes the key (`--set checkpoint.local-dir=`).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::de::DeserializeOwned;

use super::ConfigError;

/// One `KEY=VALUE`.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    text: String,
    path: Vec<String>,
    /// `None`: remove the key.
    value: Option<toml::Value>,
}

impl FromStr for Setting {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (key, value) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))?;
        let path: Vec<String> = key.trim().split('.').map(str::to_owned).collect();
        if path.iter().any(String::is_empty) {
            return Err(format!("{key:?} is not a dotted key like kafka.bootstrap"));
        }
        let value = value.trim();
        let value = (!value.is_empty()).then(|| {
            toml::from_str::<toml::Table>(&format!("v = {value}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(value.to_owned()))
        });
        Ok(Self {
            text: text.to_owned(),
            path,
            value,
        })
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Applies `settings` in order to the TOML `table`.
fn apply(table: &mut toml::Table, settings: &[Setting]) -> Result<(), ConfigError> {
    for setting in settings {
        let Some((last, parents)) = setting.path.split_last() else {
            continue;
        };
        let mut at = &mut *table;
        for key in parents {
            let entry = at
                .entry(key.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            at = entry.as_table_mut().ok_or_else(|| ConfigError::Set {
                setting: setting.text.clone(),
                reason: format!("`{key}` is not a table"),
            })?;
        }
        match &setting.value {
            Some(value) => {
                at.insert(last.clone(), value.clone());
            }
            None => {
                at.remove(last);
            }
        }
    }
    Ok(())
}

/// The file at `path` with `settings` applied, deserialized (not yet validated).
pub(super) fn read<T: DeserializeOwned>(
    path: &Path,
    settings: &[Setting],
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, settings).map_err(|e| match e {
        ConfigError::Parse { error, .. } => ConfigError::Parse {
            path: path.to_owned(),
            error,
        },
        other => other,
    })
}

/// `text` with `settings` applied, deserialized (not yet validated).
pub(super) fn parse<T: DeserializeOwned>(
    text: &str,
    settings: &[Setting],
) -> Result<T, ConfigError> {
    let bad = |error| ConfigError::Parse {
        path: PathBuf::new(),
        error: Box::new(error),
    };
    let mut table: toml::Table = toml::from_str(text).map_err(bad)?;
    apply(&mut table, settings)?;
    T::deserialize(toml::Value::Table(table)).map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> Setting {
        text.parse().unwrap()
    }

    #[test]
    fn values_are_toml_and_anything_else_is_a_string() {
        let value = |text: &str| set(text).value;
        assert_eq!(value("a=10"), Some(toml::Value::Integer(10)));
        assert_eq!(value("a=true"), Some(toml::Value::Boolean(true)));
        assert_eq!(value("a=\"x y\""), Some(toml::Value::String("x y".into())));
        assert_eq!(
            value("a=127.0.0.1:9092"),
            Some(toml::Value::String("127.0.0.1:9092".into()))
        );
        assert_eq!(value("a=500ms"), Some(toml::Value::String("500ms".into())));
        assert_eq!(value("a="), None);
        let members = value("lease.member=[{ id = 1, addr = \"h:1\" }]").unwrap();
        assert_eq!(members.as_array().map(Vec::len), Some(1));
        assert!("no-equals".parse::<Setting>().is_err());
        assert!("a..b=1".parse::<Setting>().is_err());
    }

    #[test]
    fn settings_replace_add_and_remove_keys_and_a_path_through_a_value_is_an_error() {
        let mut table: toml::Table = toml::from_str("a = 1\n[b]\nc = \"x\"\nd = 2\n").unwrap();
        apply(
            &mut table,
            &[set("a=2"), set("b.c=y"), set("b.d="), set("e.f=3")],
        )
        .unwrap();
        let expected: toml::Table = toml::from_str("a = 2\n[b]\nc = \"y\"\n[e]\nf = 3\n").unwrap();
        assert_eq!(table, expected);
        let err = apply(&mut table, &[set("a.b=1")]).unwrap_err().to_string();
        assert!(
            err.contains("a.b=1") && err.contains("`a` is not a table"),
            "{err}"
        );
    }
}
