//! Answers of the Prometheus HTTP API (`/api/v1/query`), which Thanos,
//! Mimir and VictoriaMetrics speak too: an instant vector becomes
//! [`Series`]; an error answer becomes the store's own words.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::model::cluster::Series;

/// Why an answer is no instant vector.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AnswerError {
    /// The store answered with an error (`"status":"error"`).
    #[error("the store refused the query ({kind}): {message}")]
    Refused {
        /// `errorType`: bad_data, timeout, execution, ...
        kind: String,
        /// `error`.
        message: String,
    },
    /// The body is not the API's JSON.
    #[error(
        "the answer is not the Prometheus API's JSON ({0}); is the URL a Prometheus, Thanos Query, Mimir or VictoriaMetrics endpoint?"
    )]
    NotTheApi(String),
    /// A result of another type than an instant vector.
    #[error("the answer is a {0}, not an instant vector")]
    NotAVector(String),
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    #[serde(default)]
    result: Vec<Sample>,
}

#[derive(Deserialize)]
struct Sample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    /// [unix time, "value"]
    value: (f64, String),
}

/// The series of an instant-vector answer. Values that are no number
/// (`NaN`, garbage) become NaN, which the model ignores.
pub fn instant_vector(body: &[u8]) -> Result<Vec<Series>, AnswerError> {
    let answer: Answer =
        serde_json::from_slice(body).map_err(|e| AnswerError::NotTheApi(e.to_string()))?;
    if answer.status != "success" {
        return Err(AnswerError::Refused {
            kind: answer.error_type.unwrap_or_else(|| answer.status.clone()),
            message: answer.error.unwrap_or_default(),
        });
    }
    let data = answer
        .data
        .ok_or_else(|| AnswerError::NotTheApi("no data".to_string()))?;
    if data.result_type != "vector" {
        return Err(AnswerError::NotAVector(data.result_type));
    }
    Ok(data
        .result
        .into_iter()
        .map(|mut s| {
            s.metric.remove("__name__");
            Series {
                labels: s.metric,
                value: s.value.1.parse().unwrap_or(f64::NAN),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_becomes_series_without_the_metric_name() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"observer_node_info","node":"gpu","address":"10.10.10.62"},"value":[1765000000.5,"1"]},
            {"metric":{"node":"cp1"},"value":[1765000000.5,"NaN"]}]}}"#;
        let series = instant_vector(body).unwrap();
        assert_eq!(series.len(), 2);
        assert_eq!(
            series[0].labels,
            BTreeMap::from([
                ("address".to_string(), "10.10.10.62".to_string()),
                ("node".to_string(), "gpu".to_string())
            ])
        );
        assert_eq!(series[0].value, 1.0);
        assert!(series[1].value.is_nan());
    }

    #[test]
    fn errors_are_named() {
        let refused =
            br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        assert_eq!(
            instant_vector(refused),
            Err(AnswerError::Refused {
                kind: "bad_data".to_string(),
                message: "parse error at char 3".to_string()
            })
        );
        assert!(matches!(
            instant_vector(b"<html>login</html>"),
            Err(AnswerError::NotTheApi(_))
        ));
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert_eq!(
            instant_vector(matrix),
            Err(AnswerError::NotAVector("matrix".to_string()))
        );
    }
}
