//! Answers of the Prometheus HTTP API (`/api/v1/query`), which Thanos,
//! Mimir and VictoriaMetrics speak too: an instant vector becomes
//! [`Series`]; an error answer becomes the store's own words.

use std::{collections::BTreeMap, fmt, io::Read};

use serde::{
    Deserialize, Deserializer,
    de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor},
};

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
    /// Reading the answer failed part way (the connection broke, the
    /// timeout passed).
    #[error("the answer broke off: {0}")]
    BrokeOff(String),
}

#[derive(Deserialize)]
struct Sample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    /// [unix time, "value"]
    value: (f64, String),
}

/// Decodes an instant-vector answer as it is read, handing each series to
/// `each` (without `__name__`; values that are no number, `NaN` or
/// garbage, become NaN, which the model ignores). The answer is never
/// held whole: a full mesh of 1,000 nodes answers millions of series.
/// serde_json's derive would build the whole `result` array first, hence
/// the visitors by hand.
pub fn instant_vector(reader: impl Read, mut each: impl FnMut(Series)) -> Result<(), AnswerError> {
    let broke = |e: serde_json::Error| {
        if e.is_io() {
            AnswerError::BrokeOff(e.to_string())
        } else {
            AnswerError::NotTheApi(e.to_string())
        }
    };
    let mut json = serde_json::Deserializer::from_reader(reader);
    let answer = AnswerSeed { each: &mut each }
        .deserialize(&mut json)
        .map_err(broke)?;
    json.end().map_err(broke)?;
    if answer.status != "success" {
        return Err(AnswerError::Refused {
            kind: answer.error_type.unwrap_or(answer.status),
            message: answer.error.unwrap_or_default(),
        });
    }
    match answer.result_type {
        None => Err(AnswerError::NotTheApi("no data".to_string())),
        Some(kind) if kind != "vector" => Err(AnswerError::NotAVector(kind)),
        Some(_) => Ok(()),
    }
}

/// The answer's envelope: what is left once its series went to `each`.
#[derive(Default)]
struct Answer {
    status: String,
    /// `data.resultType`; `None` without `data`.
    result_type: Option<String>,
    error_type: Option<String>,
    error: Option<String>,
}

struct AnswerSeed<'a, F> {
    each: &'a mut F,
}

impl<'de, F: FnMut(Series)> DeserializeSeed<'de> for AnswerSeed<'_, F> {
    type Value = Answer;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Answer, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(Series)> Visitor<'de> for AnswerSeed<'_, F> {
    type Value = Answer;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the API's answer object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Answer, A::Error> {
        let mut answer = Answer::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "status" => answer.status = map.next_value()?,
                "errorType" => answer.error_type = map.next_value()?,
                "error" => answer.error = map.next_value()?,
                "data" => {
                    answer.result_type = Some(map.next_value_seed(DataSeed {
                        each: &mut *self.each,
                    })?)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(answer)
    }
}

/// `data`: its `result` goes to `each` when it is a vector (Prometheus
/// writes `resultType` first; a `result` before it is read as a vector
/// and fails on the first series that is none); the value is `resultType`.
struct DataSeed<'a, F> {
    each: &'a mut F,
}

impl<'de, F: FnMut(Series)> DeserializeSeed<'de> for DataSeed<'_, F> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(Series)> Visitor<'de> for DataSeed<'_, F> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the answer's data object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        let mut result_type: Option<String> = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "resultType" => result_type = Some(map.next_value()?),
                "result" if result_type.as_deref().is_none_or(|t| t == "vector") => map
                    .next_value_seed(ResultSeed {
                        each: &mut *self.each,
                    })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(result_type.unwrap_or_default())
    }
}

/// `data.result` of a vector, one series at a time.
struct ResultSeed<'a, F> {
    each: &'a mut F,
}

impl<'de, F: FnMut(Series)> DeserializeSeed<'de> for ResultSeed<'_, F> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, F: FnMut(Series)> Visitor<'de> for ResultSeed<'_, F> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of series")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(mut sample) = seq.next_element::<Sample>()? {
            sample.metric.remove("__name__");
            (self.each)(Series {
                labels: sample.metric,
                value: sample.value.1.parse().unwrap_or(f64::NAN),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(body: &[u8]) -> Result<Vec<Series>, AnswerError> {
        let mut series = Vec::new();
        instant_vector(body, |s| series.push(s))?;
        Ok(series)
    }

    #[test]
    fn a_vector_becomes_series_without_the_metric_name() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"observer_node_info","node":"gpu","address":"10.10.10.62"},"value":[1765000000.5,"1"]},
            {"metric":{"node":"cp1"},"value":[1765000000.5,"NaN"]}]}}"#;
        let series = decoded(body).unwrap();
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
            decoded(refused),
            Err(AnswerError::Refused {
                kind: "bad_data".to_string(),
                message: "parse error at char 3".to_string()
            })
        );
        assert!(matches!(
            decoded(b"<html>login</html>"),
            Err(AnswerError::NotTheApi(_))
        ));
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert_eq!(
            decoded(matrix),
            Err(AnswerError::NotAVector("matrix".to_string()))
        );
    }

    #[test]
    fn a_matrix_is_skipped_and_named_and_other_keys_are_ignored() {
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"node":"gpu"},"values":[[1765000000,"1"]]}]}}"#;
        assert_eq!(
            decoded(matrix),
            Err(AnswerError::NotAVector("matrix".to_string()))
        );
        let extra = br#"{"status":"success","warnings":["w"],"data":{"resultType":"vector",
            "stats":{"timings":{}},"result":[{"metric":{"node":"gpu"},"value":[1,"2"]}]},"infos":[]}"#;
        assert_eq!(decoded(extra).unwrap().len(), 1);
    }

    /// A connection that breaks after `bytes`.
    struct Breaks {
        bytes: &'static [u8],
    }

    impl Read for Breaks {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.bytes.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "connection reset by peer",
                ));
            }
            let n = buf.len().min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    #[test]
    fn series_go_out_as_they_are_read_and_a_broken_answer_is_named() {
        let mut seen = Vec::new();
        let broken = Breaks {
            bytes: br#"{"status":"success","data":{"resultType":"vector","result":[
                {"metric":{"node":"gpu"},"value":[1,"3"]},
                {"metric":{"node":"cp1"},"value":[1,"4"]},"#,
        };
        let outcome = instant_vector(broken, |s| seen.push(s.value));
        assert!(
            matches!(&outcome, Err(AnswerError::BrokeOff(e)) if e.contains("connection reset")),
            "{outcome:?}"
        );
        assert_eq!(seen, [3.0, 4.0]);
        assert!(matches!(
            decoded(br#"{"status":"success","data":{"resultType":"vector","result":[{"#),
            Err(AnswerError::NotTheApi(_))
        ));
    }
}
