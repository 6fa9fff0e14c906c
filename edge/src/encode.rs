//! Answers, byte for byte as the Python edge writes them: the HTTP JSON body of
//! `corral.protocol.http_codec.encode_response` (orjson with `OPT_SERIALIZE_NUMPY`, its
//! non-finite floats rewritten as Triton writes them, binary outputs after the JSON), the
//! HTTP head of the direct route (`_write_response`, `responses.head`), and the gRPC
//! `ModelInferResponse` of `grpc_codec.serialize_response`.

use crate::plain::DataType;
use crate::text::push_json_string;

/// An output's element type: a fixed-size numeric datatype or BOOL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputType {
    Number(DataType),
    Bool,
}

impl OutputType {
    pub fn parse(name: &str) -> Option<Self> {
        if name == "BOOL" {
            Some(Self::Bool)
        } else {
            DataType::parse(name.as_bytes()).map(Self::Number)
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Number(datatype) => datatype.name(),
            Self::Bool => "BOOL",
        }
    }

    pub fn itemsize(self) -> usize {
        match self {
            Self::Number(datatype) => datatype.itemsize(),
            Self::Bool => 1,
        }
    }
}

/// One output to encode: its elements' little-endian bytes, row-major.
pub struct Output<'a> {
    pub name: &'a str,
    pub datatype: OutputType,
    pub shape: &'a [i64],
    pub data: &'a [u8],
}

impl Output<'_> {
    /// Checks the shape against the elements, as `_check_output_shape` does.
    pub fn check(&self) -> Result<(), String> {
        let mut count: i128 = 1;
        for &dim in self.shape {
            count = count.saturating_mul(i128::from(dim));
        }
        let size = self.datatype.itemsize();
        let elements = self.data.len() / size;
        if !self.data.len().is_multiple_of(size) || count != elements as i128 {
            let dims: Vec<String> = self.shape.iter().map(ToString::to_string).collect();
            return Err(format!(
                "output '{}': shape [{}] does not fit its {} elements",
                self.name,
                dims.join(", "),
                elements
            ));
        }
        Ok(())
    }
}

/// What the request asked of the answer's outputs.
#[derive(Clone, Debug, Default)]
pub struct Asked {
    /// Requested outputs by name, with their `binary_data` (None: not given).
    pub outputs: Vec<(String, Option<bool>)>,
    /// The request's `binary_data_output`.
    pub binary_data_output: bool,
}

impl Asked {
    fn binary(&self, name: &str) -> bool {
        for (requested, binary) in &self.outputs {
            if requested == name {
                return binary.unwrap_or(self.binary_data_output);
            }
        }
        self.binary_data_output
    }
}

/// The HTTP body answering an inference request, and its JSON part's length when binary
/// outputs follow it (`encode_response`'s two values).
pub fn http_body(
    model_name: &str,
    model_version: Option<&str>,
    id: Option<&str>,
    outputs: &[Output<'_>],
    asked: &Asked,
) -> Result<(Vec<u8>, Option<usize>), String> {
    let mut json =
        Vec::with_capacity(128 + outputs.iter().map(|o| o.data.len() * 3).sum::<usize>());
    json.extend_from_slice(b"{\"model_name\":");
    push_json_string(&mut json, model_name);
    if let Some(version) = model_version {
        json.extend_from_slice(b",\"model_version\":");
        push_json_string(&mut json, version);
    }
    if let Some(id) = id {
        json.extend_from_slice(b",\"id\":");
        push_json_string(&mut json, id);
    }
    json.extend_from_slice(b",\"outputs\":[");
    let mut binary: Vec<&[u8]> = Vec::new();
    for (index, output) in outputs.iter().enumerate() {
        output.check()?;
        if index > 0 {
            json.push(b',');
        }
        json.extend_from_slice(b"{\"name\":");
        push_json_string(&mut json, output.name);
        json.extend_from_slice(b",\"datatype\":\"");
        json.extend_from_slice(output.datatype.name().as_bytes());
        json.extend_from_slice(b"\",\"shape\":[");
        let mut numbers = itoa::Buffer::new();
        for (at, &dim) in output.shape.iter().enumerate() {
            if at > 0 {
                json.push(b',');
            }
            json.extend_from_slice(numbers.format(dim).as_bytes());
        }
        json.push(b']');
        if asked.binary(output.name) {
            json.extend_from_slice(b",\"parameters\":{\"binary_data_size\":");
            json.extend_from_slice(numbers.format(output.data.len()).as_bytes());
            json.extend_from_slice(b"}}");
            binary.push(output.data);
        } else {
            json.extend_from_slice(b",\"data\":[");
            push_values(&mut json, output.datatype, output.data);
            json.extend_from_slice(b"]}");
        }
    }
    json.extend_from_slice(b"]}");
    if binary.is_empty() {
        return Ok((json, None));
    }
    let json_length = json.len();
    for chunk in binary {
        json.extend_from_slice(chunk);
    }
    Ok((json, Some(json_length)))
}

fn push_values(out: &mut Vec<u8>, datatype: OutputType, data: &[u8]) {
    let mut integers = itoa::Buffer::new();
    let mut floats = ryu::Buffer::new();
    macro_rules! each {
        ($size:expr, $convert:expr) => {
            for (index, chunk) in data.chunks_exact($size).enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                let bytes: [u8; $size] = chunk.try_into().unwrap_or([0; $size]);
                #[allow(clippy::redundant_closure_call)]
                $convert(out, bytes);
            }
        };
    }
    match datatype {
        OutputType::Bool => each!(1, |out: &mut Vec<u8>, b: [u8; 1]| out
            .extend_from_slice(if b[0] != 0 { b"true" } else { b"false" })),
        OutputType::Number(number) => match number {
            DataType::Uint8 => each!(1, |out: &mut Vec<u8>, b: [u8; 1]| out
                .extend_from_slice(integers.format(b[0]).as_bytes())),
            DataType::Int8 => each!(1, |out: &mut Vec<u8>, b: [u8; 1]| out
                .extend_from_slice(integers.format(i8::from_le_bytes(b)).as_bytes())),
            DataType::Uint16 => each!(2, |out: &mut Vec<u8>, b| out
                .extend_from_slice(integers.format(u16::from_le_bytes(b)).as_bytes())),
            DataType::Int16 => each!(2, |out: &mut Vec<u8>, b| out
                .extend_from_slice(integers.format(i16::from_le_bytes(b)).as_bytes())),
            DataType::Uint32 => each!(4, |out: &mut Vec<u8>, b| out
                .extend_from_slice(integers.format(u32::from_le_bytes(b)).as_bytes())),
            DataType::Int32 => each!(4, |out: &mut Vec<u8>, b| out
                .extend_from_slice(integers.format(i32::from_le_bytes(b)).as_bytes())),
            DataType::Uint64 => each!(8, |out: &mut Vec<u8>, b| out
                .extend_from_slice(integers.format(u64::from_le_bytes(b)).as_bytes())),
            DataType::Int64 => each!(8, |out: &mut Vec<u8>, b| out
                .extend_from_slice(integers.format(i64::from_le_bytes(b)).as_bytes())),
            DataType::Fp16 => each!(2, |out: &mut Vec<u8>, b| push_f32(
                out,
                &mut floats,
                f16_to_f32(u16::from_le_bytes(b))
            )),
            DataType::Fp32 => each!(4, |out: &mut Vec<u8>, b| push_f32(
                out,
                &mut floats,
                f32::from_le_bytes(b)
            )),
            DataType::Fp64 => each!(8, |out: &mut Vec<u8>, b| push_f64(
                out,
                &mut floats,
                f64::from_le_bytes(b)
            )),
        },
    }
}

/// A half float's value as a float (exact).
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits >> 15) << 31;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    let magnitude = match (exponent, mantissa) {
        (0, 0) => 0,
        (0, _) => {
            // Subnormal: normalise.
            let shift = mantissa.leading_zeros() - 21;
            let mantissa = (mantissa << shift) & 0x3ff;
            ((127 - 15 + 1 - shift) << 23) | (mantissa << 13)
        }
        (0x1f, 0) => 0xff << 23,
        (0x1f, _) => (0xff << 23) | (mantissa << 13) | 0x40_0000,
        _ => ((exponent + 127 - 15) << 23) | (mantissa << 13),
    };
    f32::from_bits(sign | magnitude)
}

fn push_non_finite(out: &mut Vec<u8>, nan: bool, negative: bool) {
    // How Triton writes them, and encode_response after orjson's null (a NaN's sign is not kept).
    out.extend_from_slice(if nan {
        b"NaN"
    } else if negative {
        b"-Infinity"
    } else {
        b"Infinity"
    });
}

fn push_f32(out: &mut Vec<u8>, buffer: &mut ryu::Buffer, value: f32) {
    if !value.is_finite() {
        push_non_finite(out, value.is_nan(), value < 0.0);
        return;
    }
    let shortest = buffer.format_finite(value);
    push_orjson_float(out, shortest, -6, 13);
}

fn push_f64(out: &mut Vec<u8>, buffer: &mut ryu::Buffer, value: f64) {
    if !value.is_finite() {
        push_non_finite(out, value.is_nan(), value < 0.0);
        return;
    }
    let shortest = buffer.format_finite(value);
    push_orjson_float(out, shortest, -5, 16);
}

/// Rewrites a shortest round-trip float (as ryu writes it) in orjson's layout: plain
/// decimals for decimal exponents in `low..high` (`0.00001`, `1000000000000000.0`), else
/// `d.ddde+x` / `de-x`.
fn push_orjson_float(out: &mut Vec<u8>, shortest: &str, low: i32, high: i32) {
    let (negative, text) = match shortest.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, shortest),
    };
    let (mantissa, written_exponent) = match text.split_once('e') {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i32>().unwrap_or(0)),
        None => (text, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // Digits without the point, and the exponent of the first one.
    let mut digits: Vec<u8> = Vec::with_capacity(20);
    digits.extend_from_slice(whole.as_bytes());
    digits.extend_from_slice(fraction.as_bytes());
    let mut exponent = written_exponent + whole.len() as i32 - 1;
    let leading = digits.iter().take_while(|&&d| d == b'0').count();
    if leading == digits.len() {
        // Zero.
        if negative {
            out.push(b'-');
        }
        out.extend_from_slice(b"0.0");
        return;
    }
    digits.drain(..leading);
    exponent -= leading as i32;
    while digits.len() > 1 && digits.last() == Some(&b'0') {
        digits.pop();
    }
    if negative {
        out.push(b'-');
    }
    let count = digits.len() as i32;
    if (low..high).contains(&exponent) {
        if exponent >= 0 {
            let point = (exponent + 1) as usize;
            if digits.len() <= point {
                out.extend_from_slice(&digits);
                out.resize(out.len() + point - digits.len(), b'0');
                out.extend_from_slice(b".0");
            } else {
                out.extend_from_slice(&digits[..point]);
                out.push(b'.');
                out.extend_from_slice(&digits[point..]);
            }
        } else {
            out.extend_from_slice(b"0.");
            out.resize(out.len() + (-exponent - 1) as usize, b'0');
            out.extend_from_slice(&digits);
        }
    } else {
        out.push(digits[0]);
        if count > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if exponent < 0 { b'-' } else { b'+' });
        out.extend_from_slice(itoa::Buffer::new().format(exponent.abs()).as_bytes());
    }
}

/// The content type of an answer: JSON, or the binary tensor extension's.
pub const JSON: &[u8] = b"application/json";
pub const BINARY: &[u8] = b"application/octet-stream";

/// A whole HTTP/1.1 response as the direct route writes it: uvicorn's status line, its
/// default headers (`defaults`: date and server), `content-type`, `content-length`, the
/// `extra` lines (each `name: value\r\n`), `connection: close` unless kept alive, the body.
pub fn http_response(
    status: u16,
    defaults: &crate::text::DateCache,
    content_type: &[u8],
    extra: &[u8],
    body: &[u8],
    keep_alive: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + extra.len() + body.len());
    out.extend_from_slice(&crate::text::status_line(status));
    defaults.push_defaults(&mut out);
    out.extend_from_slice(b"content-type: ");
    out.extend_from_slice(content_type);
    out.extend_from_slice(b"\r\ncontent-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(extra);
    out.extend_from_slice(if keep_alive {
        b"\r\n"
    } else {
        b"connection: close\r\n\r\n"
    });
    out.extend_from_slice(body);
    out
}

/// The refusal the Python edge's connections write (`_write_error`): a JSON error, no
/// default headers, `connection: close`.
pub fn http_refusal(status: u16, message: &str) -> Vec<u8> {
    let body = crate::text::error_body(message);
    let mut out = Vec::with_capacity(120 + body.len());
    out.extend_from_slice(&crate::text::status_line(status));
    out.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    out.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
    out.extend_from_slice(&body);
    out
}

// -- gRPC ---------------------------------------------------------------------------------

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value > 0x7f {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn string_field(out: &mut Vec<u8>, number: u8, text: &str) {
    if text.is_empty() {
        return; // proto3 omits an empty string
    }
    out.push(number << 3 | 2);
    varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

/// `ModelInferResponse` serialized as protobuf does (fields in number order, empty strings
/// and shapes omitted, shape packed), outputs as `raw_output_contents`.
pub fn grpc_message(
    model_name: &str,
    model_version: Option<&str>,
    id: Option<&str>,
    outputs: &[Output<'_>],
) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(64 + outputs.iter().map(|o| o.data.len() + 32).sum::<usize>());
    string_field(&mut out, 1, model_name);
    string_field(&mut out, 2, model_version.unwrap_or(""));
    string_field(&mut out, 3, id.unwrap_or(""));
    for output in outputs {
        output.check()?;
        let mut tensor = Vec::with_capacity(32);
        string_field(&mut tensor, 1, output.name);
        string_field(&mut tensor, 2, output.datatype.name());
        if !output.shape.is_empty() {
            let mut dims = Vec::with_capacity(output.shape.len() * 2);
            for &dim in output.shape {
                varint(&mut dims, dim as u64);
            }
            tensor.push(3 << 3 | 2);
            varint(&mut tensor, dims.len() as u64);
            tensor.extend_from_slice(&dims);
        }
        out.push(5 << 3 | 2);
        varint(&mut out, tensor.len() as u64);
        out.extend_from_slice(&tensor);
    }
    for output in outputs {
        out.push(6 << 3 | 2);
        varint(&mut out, output.data.len() as u64);
        out.extend_from_slice(output.data);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f64s(values: &[f64]) -> String {
        let mut out = Vec::new();
        let mut buffer = ryu::Buffer::new();
        for (index, &value) in values.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            push_f64(&mut out, &mut buffer, value);
        }
        String::from_utf8(out).unwrap_or_default()
    }

    fn f32s(values: &[f32]) -> String {
        let mut out = Vec::new();
        let mut buffer = ryu::Buffer::new();
        for (index, &value) in values.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            push_f32(&mut out, &mut buffer, value);
        }
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn floats_as_orjson() {
        assert_eq!(
            f64s(&[
                1.0,
                0.1,
                1e16,
                1e15,
                123456789.0,
                1.5e-7,
                1e-5,
                1e-6,
                -0.0,
                5e-324
            ]),
            "1.0,0.1,1e+16,1000000000000000.0,123456789.0,1.5e-7,0.00001,1e-6,-0.0,5e-324"
        );
        assert_eq!(
            f32s(&[
                1.0,
                0.1,
                1e13,
                1e12,
                123456790.0,
                1e-7,
                1e-6,
                1.25e-6,
                3.4e38,
                f32::NAN
            ]),
            "1.0,0.1,1e+13,1000000000000.0,123456790.0,1e-7,0.000001,0.00000125,3.4e+38,NaN"
        );
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 5.9604645e-8);
    }

    #[test]
    fn body() {
        let data: Vec<u8> = [1.5f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let outputs = [Output {
            name: "y",
            datatype: OutputType::Number(DataType::Fp32),
            shape: &[1, 2],
            data: &data,
        }];
        let (body, length) =
            http_body("m", Some("1"), Some("x"), &outputs, &Asked::default()).unwrap_or_default();
        assert_eq!(length, None);
        assert_eq!(
            body,
            br#"{"model_name":"m","model_version":"1","id":"x","outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"data":[1.5,2.0]}]}"#
        );
    }
}
