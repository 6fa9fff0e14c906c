//! The plain inference requests, decoded natively to exactly what corral's Python decoders
//! give (`corral/protocol/_plain_requests.py`, `http_codec.decode_request`); anything else is
//! `None` and goes over the bridge, where the Python edge decodes it or says what is wrong.
//!
//! Two HTTP kinds: a JSON body whose inputs are FP32 or FP64 `data` arrays of numbers, and a
//! binary body (the binary tensor extension) whose inputs are fixed-size numeric tensors in
//! the bytes after the JSON part. Either may name requested outputs (`name`, maybe
//! `parameters: {"binary_data": bool}`) and the `binary_data_output` request parameter, which
//! the general Python decoder reads to the same request. No DOM: the JSON is read in one pass.

use bytes::Bytes;

/// numpy 1.x allows at most 32 dimensions: corral's `MAX_RANK`.
pub const MAX_RANK: usize = 32;
/// corral refuses a tensor whose non-zero dimensions need more bytes than this.
const MAX_TENSOR_BYTES: u128 = 1 << 62;

/// The protocol's fixed-size numeric datatypes (BOOL and BYTES always take the bridge).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
}

impl DataType {
    /// The datatype a protocol name spells, if it is one of these.
    pub fn parse(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"UINT8" => Self::Uint8,
            b"UINT16" => Self::Uint16,
            b"UINT32" => Self::Uint32,
            b"UINT64" => Self::Uint64,
            b"INT8" => Self::Int8,
            b"INT16" => Self::Int16,
            b"INT32" => Self::Int32,
            b"INT64" => Self::Int64,
            b"FP16" => Self::Fp16,
            b"FP32" => Self::Fp32,
            b"FP64" => Self::Fp64,
            _ => return None,
        })
    }

    /// The protocol's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uint8 => "UINT8",
            Self::Uint16 => "UINT16",
            Self::Uint32 => "UINT32",
            Self::Uint64 => "UINT64",
            Self::Int8 => "INT8",
            Self::Int16 => "INT16",
            Self::Int32 => "INT32",
            Self::Int64 => "INT64",
            Self::Fp16 => "FP16",
            Self::Fp32 => "FP32",
            Self::Fp64 => "FP64",
        }
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            Self::Uint8 | Self::Int8 => 1,
            Self::Uint16 | Self::Int16 | Self::Fp16 => 2,
            Self::Uint32 | Self::Int32 | Self::Fp32 => 4,
            Self::Uint64 | Self::Int64 | Self::Fp64 => 8,
        }
    }
}

/// A tensor's elements: a slice of the request's bytes, or values decoded from JSON, held
/// in 8-byte words so that every element type is aligned.
#[derive(Clone, Debug)]
pub enum Storage {
    Shared(Bytes),
    Words(Vec<u64>, usize),
}

impl Storage {
    /// The elements' bytes, little-endian.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Shared(bytes) => bytes,
            Self::Words(words, len) => &bytemuck::cast_slice::<u64, u8>(words)[..*len],
        }
    }

    /// A slice of `body` as elements of `itemsize` bytes: shared when aligned, else copied
    /// into words (numpy's and onnxruntime's kernels want aligned elements, as the Python
    /// decoder's copy of a misaligned tensor says).
    pub fn from_body(body: Bytes, itemsize: usize) -> Self {
        if (body.as_ptr() as usize).is_multiple_of(itemsize) {
            return Self::Shared(body);
        }
        let mut words = vec![0u64; body.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..body.len()].copy_from_slice(&body);
        Self::Words(words, body.len())
    }
}

/// One decoded input tensor.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<u64>,
    pub data: Storage,
}

/// A plain request, decoded.
#[derive(Clone, Debug, Default)]
pub struct PlainRequest {
    pub id: Option<String>,
    pub inputs: Vec<Tensor>,
    /// Requested outputs: name and `binary_data` (None when not given).
    pub outputs: Vec<(String, Option<bool>)>,
    /// The `binary_data_output` request parameter; false when absent.
    pub binary_data_output: bool,
}

/// The element count of `shape` if corral's `element_count` takes it for `itemsize`.
pub fn element_count(shape: &[u64], itemsize: usize) -> Option<u64> {
    if shape.len() > MAX_RANK {
        return None;
    }
    let mut nonzero: u128 = 1;
    let mut any_zero = false;
    for &dim in shape {
        if dim == 0 {
            any_zero = true;
        } else {
            nonzero = nonzero.checked_mul(u128::from(dim))?;
            if nonzero > MAX_TENSOR_BYTES {
                return None;
            }
        }
    }
    // BYTES elements count 8 bytes in corral's bound; every fixed-size type at most 8 too.
    if nonzero * itemsize.max(8) as u128 > MAX_TENSOR_BYTES {
        return None;
    }
    if any_zero {
        Some(0)
    } else {
        u64::try_from(nonzero).ok()
    }
}

// -- the JSON reader --------------------------------------------------------------------

struct Reader<'a> {
    text: &'a [u8],
    at: usize,
}

/// A failed read: the request is not plain (or not valid): it takes the bridge.
struct NotPlain;

type Read<T> = Result<T, NotPlain>;

/// Sets a member read once; a repeated key is refused.
fn once<T>(slot: &mut Option<T>, value: Read<T>) -> Read<()> {
    if slot.is_some() {
        return Err(NotPlain);
    }
    *slot = Some(value?);
    Ok(())
}

impl<'a> Reader<'a> {
    fn skip_ws(&mut self) {
        while let Some(&byte) = self.text.get(self.at) {
            if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
                self.at += 1;
            } else {
                break;
            }
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.text.get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Read<()> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(NotPlain)
        }
    }

    /// Whether the next token is `byte` (consumed if so).
    fn take(&mut self, byte: u8) -> bool {
        if self.peek() == Some(byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// A string, unescaped; the text is valid UTF-8 already (checked once, whole).
    fn string(&mut self) -> Read<String> {
        self.expect(b'"')?;
        let start = self.at;
        // The common case: no escape, no control character.
        loop {
            match self.text.get(self.at) {
                None => return Err(NotPlain),
                Some(b'"') => {
                    let raw = &self.text[start..self.at];
                    self.at += 1;
                    return std::str::from_utf8(raw)
                        .map(str::to_owned)
                        .map_err(|_| NotPlain);
                }
                Some(b'\\') => break,
                Some(&byte) if byte < 0x20 => return Err(NotPlain),
                Some(_) => self.at += 1,
            }
        }
        let mut out: Vec<u8> = self.text[start..self.at].to_vec();
        loop {
            let byte = *self.text.get(self.at).ok_or(NotPlain)?;
            self.at += 1;
            match byte {
                b'"' => return String::from_utf8(out).map_err(|_| NotPlain),
                b'\\' => {
                    let escape = *self.text.get(self.at).ok_or(NotPlain)?;
                    self.at += 1;
                    let simple = match escape {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => 0,
                        _ => return Err(NotPlain),
                    };
                    if escape != b'u' {
                        out.push(simple);
                        continue;
                    }
                    let high = self.hex4()?;
                    let code = if (0xD800..0xDC00).contains(&high) {
                        // A lone surrogate is refused, as orjson refuses it.
                        if self.text.get(self.at..self.at + 2) != Some(b"\\u") {
                            return Err(NotPlain);
                        }
                        self.at += 2;
                        let low = self.hex4()?;
                        if !(0xDC00..0xE000).contains(&low) {
                            return Err(NotPlain);
                        }
                        0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00..0xE000).contains(&high) {
                        return Err(NotPlain);
                    } else {
                        high
                    };
                    let character = char::from_u32(code).ok_or(NotPlain)?;
                    let mut buffer = [0u8; 4];
                    out.extend_from_slice(character.encode_utf8(&mut buffer).as_bytes());
                }
                0..=0x1f => return Err(NotPlain),
                _ => out.push(byte),
            }
        }
    }

    fn hex4(&mut self) -> Read<u32> {
        let digits = self.text.get(self.at..self.at + 4).ok_or(NotPlain)?;
        let mut value = 0u32;
        for &digit in digits {
            let nibble = match digit {
                b'0'..=b'9' => digit - b'0',
                b'a'..=b'f' => digit - b'a' + 10,
                b'A'..=b'F' => digit - b'A' + 10,
                _ => return Err(NotPlain),
            };
            value = value << 4 | u32::from(nibble);
        }
        self.at += 4;
        Ok(value)
    }

    /// A number token as JSON's grammar has it; returns its text and whether it is an
    /// integer (no fraction, no exponent), as orjson tells ints from floats.
    fn number(&mut self) -> Read<(&'a str, bool)> {
        self.skip_ws();
        let text = self.text;
        let start = self.at;
        let mut at = start;
        if text.get(at) == Some(&b'-') {
            at += 1;
        }
        match text.get(at) {
            Some(b'0') => at += 1,
            Some(b'1'..=b'9') => {
                while matches!(text.get(at), Some(b'0'..=b'9')) {
                    at += 1;
                }
            }
            _ => return Err(NotPlain),
        }
        let mut integer = true;
        if text.get(at) == Some(&b'.') {
            integer = false;
            at += 1;
            if !matches!(text.get(at), Some(b'0'..=b'9')) {
                return Err(NotPlain);
            }
            while matches!(text.get(at), Some(b'0'..=b'9')) {
                at += 1;
            }
        }
        if matches!(text.get(at), Some(b'e' | b'E')) {
            integer = false;
            at += 1;
            if matches!(text.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            if !matches!(text.get(at), Some(b'0'..=b'9')) {
                return Err(NotPlain);
            }
            while matches!(text.get(at), Some(b'0'..=b'9')) {
                at += 1;
            }
        }
        self.at = at;
        // ASCII only: the slice is valid UTF-8.
        let token = std::str::from_utf8(&text[start..at]).map_err(|_| NotPlain)?;
        Ok((token, integer))
    }

    /// A number as the double orjson and then Python give it: integers within 64 bits are
    /// Python ints, which become doubles correctly rounded (and `-0` is the integer 0);
    /// everything else is parsed as a double, and one that overflows is refused.
    fn double(&mut self) -> Read<f64> {
        let (token, integer) = self.number()?;
        if integer && token == "-0" {
            return Ok(0.0);
        }
        let value: f64 = token.parse().map_err(|_| NotPlain)?;
        if value.is_finite() {
            Ok(value)
        } else {
            Err(NotPlain)
        }
    }

    /// A non-negative integer token that fits 64 bits (a shape's dimension, a size).
    fn whole(&mut self) -> Read<u64> {
        let (token, integer) = self.number()?;
        if !integer {
            return Err(NotPlain);
        }
        if token == "-0" {
            return Ok(0);
        }
        token.parse().map_err(|_| NotPlain)
    }

    fn boolean(&mut self) -> Read<bool> {
        self.skip_ws();
        if self.text[self.at..].starts_with(b"true") {
            self.at += 4;
            Ok(true)
        } else if self.text[self.at..].starts_with(b"false") {
            self.at += 5;
            Ok(false)
        } else {
            Err(NotPlain)
        }
    }

    fn null(&mut self) -> bool {
        self.skip_ws();
        if self.text[self.at..].starts_with(b"null") {
            self.at += 4;
            true
        } else {
            false
        }
    }

    /// A key: borrowed from the text when it has no escape (the common case).
    fn key(&mut self) -> Read<std::borrow::Cow<'a, str>> {
        self.skip_ws();
        let text = self.text;
        if text.get(self.at) == Some(&b'"') {
            let start = self.at + 1;
            let mut at = start;
            while let Some(&byte) = text.get(at) {
                if byte == b'"' {
                    self.at = at + 1;
                    let raw = std::str::from_utf8(&text[start..at]).map_err(|_| NotPlain)?;
                    return Ok(std::borrow::Cow::Borrowed(raw));
                }
                if byte == b'\\' || byte < 0x20 {
                    break;
                }
                at += 1;
            }
        }
        self.string().map(std::borrow::Cow::Owned)
    }

    /// Reads an object's members, calling `member` with each key. Each caller refuses a
    /// repeated key (orjson keeps the last, which a one-pass reader cannot know ahead).
    fn object(&mut self, mut member: impl FnMut(&mut Self, &str) -> Read<()>) -> Read<()> {
        self.expect(b'{')?;
        if self.take(b'}') {
            return Ok(());
        }
        loop {
            let key = self.key()?;
            self.expect(b':')?;
            member(self, &key)?;
            if self.take(b',') {
                continue;
            }
            self.expect(b'}')?;
            return Ok(());
        }
    }

    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Read<()>) -> Read<()> {
        self.expect(b'[')?;
        if self.take(b']') {
            return Ok(());
        }
        loop {
            item(self)?;
            if self.take(b',') {
                continue;
            }
            self.expect(b']')?;
            return Ok(());
        }
    }

    fn shape(&mut self) -> Read<Vec<u64>> {
        let mut shape = Vec::with_capacity(4);
        self.array(|reader| {
            shape.push(reader.whole()?);
            if shape.len() > MAX_RANK {
                return Err(NotPlain);
            }
            Ok(())
        })?;
        Ok(shape)
    }
}

/// One input as read from the JSON part, before its elements are placed.
struct RawInput {
    name: String,
    datatype: DataType,
    shape: Vec<u64>,
    /// JSON `data`, as values of the datatype in words.
    data: Option<Storage>,
    /// Binary: its `binary_data_size`.
    size: Option<u64>,
}

fn json_data(reader: &mut Reader<'_>, datatype: DataType) -> Read<(Storage, usize)> {
    let mut words: Vec<u64> = Vec::with_capacity(8);
    let mut count = 0usize;
    match datatype {
        DataType::Fp64 => reader.array(|reader| {
            let value = reader.double()?;
            words.push(value.to_bits().to_le());
            count += 1;
            Ok(())
        })?,
        DataType::Fp32 => {
            let mut pending: Option<u32> = None;
            reader.array(|reader| {
                let value = reader.double()?;
                // numpy's astype: the double rounded to the nearest float32. A finite value
                // that becomes an infinity is refused, as corral refuses it.
                #[allow(clippy::cast_possible_truncation)]
                let narrow = value as f32;
                if narrow.is_infinite() {
                    return Err(NotPlain);
                }
                let bits = narrow.to_bits();
                match pending.take() {
                    None => pending = Some(bits),
                    Some(low) => words.push(u64::from(low) | u64::from(bits) << 32),
                }
                count += 1;
                Ok(())
            })?;
            if let Some(low) = pending {
                words.push(u64::from(low));
            }
        }
        _ => return Err(NotPlain),
    }
    let len = count * datatype.itemsize();
    Ok((Storage::Words(words, len), count))
}

fn input(reader: &mut Reader<'_>, binary: bool) -> Read<RawInput> {
    let mut name = None;
    let mut datatype = None;
    let mut shape: Option<Vec<u64>> = None;
    let mut data_at = None;
    let mut decoded = None;
    let mut parameters = None;
    reader.object(|reader, key| match key {
        "name" => once(&mut name, reader.string()),
        "datatype" => {
            let text = reader.key()?;
            once(
                &mut datatype,
                DataType::parse(text.as_bytes()).ok_or(NotPlain),
            )
        }
        "shape" => once(&mut shape, reader.shape()),
        "data" if !binary => {
            if data_at.is_some() {
                return Err(NotPlain);
            }
            data_at = Some(reader.at);
            match datatype {
                // The datatype came first (as every client writes it): read the values now.
                Some(known) => decoded = Some(json_data(reader, known)?),
                // Else its values are read once the datatype is known.
                None => skip_number_array(reader)?,
            }
            Ok(())
        }
        "parameters" if binary => {
            let mut size = None;
            reader.object(|reader, key| {
                if key != "binary_data_size" {
                    return Err(NotPlain);
                }
                once(&mut size, reader.whole())
            })?;
            once(&mut parameters, size.ok_or(NotPlain))
        }
        _ => Err(NotPlain),
    })?;
    let (name, datatype, shape) = (
        name.ok_or(NotPlain)?,
        datatype.ok_or(NotPlain)?,
        shape.ok_or(NotPlain)?,
    );
    let data = if binary {
        None
    } else {
        let (storage, count) = match decoded {
            Some(decoded) => decoded,
            None => {
                let at = data_at.ok_or(NotPlain)?;
                let mut values = Reader {
                    text: reader.text,
                    at,
                };
                json_data(&mut values, datatype)?
            }
        };
        let expected = element_count(&shape, datatype.itemsize()).ok_or(NotPlain)?;
        if count == 0 || count as u64 != expected {
            return Err(NotPlain);
        }
        Some(storage)
    };
    Ok(RawInput {
        name,
        datatype,
        shape,
        data,
        size: parameters,
    })
}

fn skip_number_array(reader: &mut Reader<'_>) -> Read<()> {
    reader.array(|reader| reader.number().map(|_| ()))
}

fn requested_output(reader: &mut Reader<'_>) -> Read<(String, Option<bool>)> {
    let mut name = None;
    let mut parameters = None;
    reader.object(|reader, key| match key {
        "name" => once(&mut name, reader.string()),
        "parameters" => {
            let mut binary_data = None;
            reader.object(|reader, key| {
                if key != "binary_data" {
                    return Err(NotPlain);
                }
                once(&mut binary_data, reader.boolean())
            })?;
            once(&mut parameters, Ok(binary_data))
        }
        _ => Err(NotPlain),
    })?;
    Ok((name.ok_or(NotPlain)?, parameters.flatten()))
}

/// Decodes an HTTP inference body when it is plain; `header_length` is the
/// `Inference-Header-Content-Length` header's value (None: the whole body is JSON).
pub fn decode_http(body: &Bytes, header_length: Option<usize>) -> Option<PlainRequest> {
    decode_http_inner(body, header_length).ok()
}

fn decode_http_inner(body: &Bytes, header_length: Option<usize>) -> Read<PlainRequest> {
    let json_length = header_length.unwrap_or(body.len());
    if json_length > body.len() {
        return Err(NotPlain);
    }
    let text = &body[..json_length];
    // orjson refuses invalid UTF-8 anywhere: checked once, so strings need no check.
    std::str::from_utf8(text).map_err(|_| NotPlain)?;
    let binary = header_length.is_some();
    let mut reader = Reader { text, at: 0 };
    let mut request = PlainRequest::default();
    let mut raw_inputs: Option<Vec<RawInput>> = None;
    let mut id: Option<Option<String>> = None;
    let mut outputs = None;
    let mut parameters = None;
    reader.object(|reader, key| match key {
        "id" => {
            let value = if reader.null() {
                Ok(None)
            } else {
                reader.string().map(Some)
            };
            once(&mut id, value)
        }
        "inputs" => {
            let mut inputs = Vec::with_capacity(2);
            reader.array(|reader| {
                inputs.push(input(reader, binary)?);
                Ok(())
            })?;
            once(&mut raw_inputs, Ok(inputs))
        }
        "outputs" => {
            let mut named: Vec<(String, Option<bool>)> = Vec::new();
            reader.array(|reader| {
                let output = requested_output(reader)?;
                if named.iter().any(|(name, _)| *name == output.0) {
                    return Err(NotPlain);
                }
                named.push(output);
                Ok(())
            })?;
            once(&mut outputs, Ok(named))
        }
        "parameters" => {
            let mut binary_data_output = None;
            reader.object(|reader, key| {
                if key != "binary_data_output" {
                    return Err(NotPlain);
                }
                once(&mut binary_data_output, reader.boolean())
            })?;
            once(&mut parameters, Ok(binary_data_output.unwrap_or(false)))
        }
        _ => Err(NotPlain),
    })?;
    request.id = id.flatten();
    request.outputs = outputs.unwrap_or_default();
    request.binary_data_output = parameters.unwrap_or(false);
    reader.skip_ws();
    if reader.at != text.len() {
        return Err(NotPlain);
    }
    let raw_inputs = raw_inputs.ok_or(NotPlain)?;
    let mut offset = json_length;
    for (index, raw) in raw_inputs.into_iter().enumerate() {
        if request.inputs[..index].iter().any(|t| t.name == raw.name) {
            return Err(NotPlain);
        }
        let data = match raw.data {
            Some(data) => data,
            None => {
                let size = usize::try_from(raw.size.ok_or(NotPlain)?).map_err(|_| NotPlain)?;
                let itemsize = raw.datatype.itemsize();
                let count = element_count(&raw.shape, itemsize).ok_or(NotPlain)?;
                if u64::try_from(size).ok() != count.checked_mul(itemsize as u64) {
                    return Err(NotPlain);
                }
                let end = offset.checked_add(size).ok_or(NotPlain)?;
                if end > body.len() {
                    return Err(NotPlain);
                }
                let slice = body.slice(offset..end);
                offset = end;
                Storage::from_body(slice, itemsize)
            }
        };
        request.inputs.push(Tensor {
            name: raw.name,
            datatype: raw.datatype,
            shape: raw.shape,
            data,
        });
    }
    if offset != body.len() {
        return Err(NotPlain);
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(tensor: &Tensor) -> Vec<f32> {
        tensor
            .data
            .as_bytes()
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn plain_json() {
        let body = Bytes::from_static(
            br#"{"id":"a\u00e9","inputs":[{"name":"X","datatype":"FP32","shape":[1,2],"data":[0.1,-0]}]}"#,
        );
        let request = decode_http(&body, None).expect("plain");
        assert_eq!(request.id.as_deref(), Some("a\u{e9}"));
        assert_eq!(floats(&request.inputs[0]), vec![0.1f32, 0.0]);
        assert!(floats(&request.inputs[0])[1].is_sign_positive());
    }

    #[test]
    fn refusals() {
        for body in [
            &br#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[true]}]}"#[..],
            br#"{"inputs":[{"name":"X","datatype":"FP32","shape":[1],"data":[1e39]}]}"#,
            br#"{"inputs":[{"name":"X","datatype":"FP32","shape":[2],"data":[1]}]}"#,
            br#"{"inputs":[{"name":"X","datatype":"FP32","shape":[0],"data":[]}]}"#,
            br#"{"inputs":[{"name":"X","name":"Y","datatype":"FP32","shape":[1],"data":[1]}]}"#,
            br#"{"inputs":[{"name":"\ud800","datatype":"FP32","shape":[1],"data":[1]}]}"#,
            br#"{"inputs":[]} x"#,
            br#"{"inputs":[{"name":"X","datatype":"INT32","shape":[1],"data":[1]}]}"#,
        ] {
            assert!(decode_http(&Bytes::copy_from_slice(body), None).is_none());
        }
    }

    #[test]
    fn plain_binary() {
        let json = br#"{"inputs":[{"name":"X","datatype":"INT32","shape":[2],"parameters":{"binary_data_size":8}}],"parameters":{"binary_data_output":true}}"#;
        let mut body = json.to_vec();
        body.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        let request = decode_http(&Bytes::from(body), Some(json.len())).expect("plain");
        assert!(request.binary_data_output);
        assert_eq!(request.inputs[0].data.as_bytes(), &[1, 0, 0, 0, 2, 0, 0, 0]);
    }
}
