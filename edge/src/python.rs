//! The Python module `corral_edge`: Budget, Edge, Group, Call, Tensor (see `README.md` and
//! `python/corral_edge/__init__.pyi`), and the private helpers the differential tests call.
//!
//! The edge's own threads never take the GIL: Python objects are made only in `take()`
//! (called by Python) and read only in the methods Python calls.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::encode::{Asked, Output, OutputType};
use crate::hosts::HostPolicy;
use crate::plain::{decode_http, Storage};
use crate::shared::{Answer, Budget, Config, Held, Pending, Protocol, Reply, Shared};

use crate::shared::DROPPED;

/// A thread-safe byte budget (atomics) shared by everything that holds request bodies.
#[pyclass(name = "Budget", module = "corral_edge", frozen)]
pub struct PyBudget {
    pub inner: Arc<Budget>,
}

#[pymethods]
impl PyBudget {
    #[new]
    fn new(limit_bytes: usize) -> Self {
        Self {
            inner: Arc::new(Budget::new(limit_bytes)),
        }
    }

    /// Reserves `n` bytes if they fit now.
    fn try_grow(&self, n: usize) -> bool {
        self.inner.try_grow(n)
    }

    /// Gives back `n` bytes.
    fn give_back(&self, n: usize) {
        self.inner.give_back(n);
    }

    #[getter]
    fn held(&self) -> usize {
        self.inner.held()
    }

    #[getter]
    fn limit(&self) -> usize {
        self.inner.limit()
    }

    fn __repr__(&self) -> String {
        format!(
            "Budget(held={}, limit={})",
            self.inner.held(),
            self.inner.limit()
        )
    }
}

/// An input tensor: a read-only, C-contiguous byte buffer of little-endian elements.
#[pyclass(module = "corral_edge", frozen)]
pub struct Tensor {
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    datatype: &'static str,
    shape: Vec<u64>,
    storage: Storage,
}

#[pymethods]
impl Tensor {
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.storage.as_bytes().len()
    }

    fn __len__(&self) -> usize {
        self.storage.as_bytes().len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Tensor(name={:?}, datatype={:?}, shape={:?})",
            self.name, self.datatype, self.shape
        )
    }

    /// The buffer protocol: a read-only view of the tensor's bytes (format "B", one
    /// dimension); the view keeps the tensor, so its bytes, alive.
    // SAFETY: PyO3 declares __getbuffer__ unsafe: Python calls it with a valid, writable
    // Py_buffer to fill, which is all the body below relies on (see its own SAFETY note).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let bytes = slf.get().storage.as_bytes();
        let (pointer, len) = (bytes.as_ptr(), bytes.len());
        // SAFETY: `view` is the caller's Py_buffer to fill, as the buffer protocol hands it
        // to __getbuffer__. The memory is owned by this frozen Tensor's `storage`, which
        // never changes and lives as long as the object; PyBuffer_FillInfo stores a new
        // reference to the object in the view, so the memory outlives every view of it.
        // The view is read-only (readonly=1: a writable request fails with BufferError), so
        // Python never writes through the `*mut` the C API's signature asks for. The length
        // fits Py_ssize_t: it is the length of a Rust allocation.
        let result = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                pointer.cast_mut().cast(),
                len as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if result < 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}

/// The part of a call only its one answer uses.
struct Open {
    reply: Reply,
    _held: Held,
    asked: Asked,
}

/// One request handed to Python; answered exactly once.
#[pyclass(module = "corral_edge", frozen)]
pub struct Call {
    #[pyo3(get)]
    protocol: &'static str,
    #[pyo3(get)]
    id: Option<String>,
    #[pyo3(get)]
    inputs: Py<PyList>,
    requested: Vec<(String, Option<bool>)>,
    #[pyo3(get)]
    binary_data_output: bool,
    #[pyo3(get)]
    timeout_us: Option<u64>,
    #[pyo3(get)]
    received_ns: u64,
    is_grpc: bool,
    open: Mutex<Option<Open>>,
    in_flight: Arc<AtomicUsize>,
}

impl Call {
    /// Sends an answer if the call is still open; false if it was answered already.
    fn finish(&self, answer: Answer) -> bool {
        let Some(open) = self.open.lock().take() else {
            return false;
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        // The body's bytes are given back before the answer can reach the client.
        let Open { reply, _held, .. } = open;
        drop(_held);
        // A client that went away dropped its end: nothing to do.
        let _ = reply.send(answer);
        true
    }

    fn answered_already() -> PyErr {
        PyRuntimeError::new_err("this call was answered already")
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let answer = if self.is_grpc {
            Answer::Grpc {
                code: 13,
                message: DROPPED.to_string(),
                body: None,
            }
        } else {
            http_answer(
                500,
                &[(b"content-type".to_vec(), b"application/json".to_vec())],
                crate::text::error_body(DROPPED),
            )
        };
        self.finish(answer);
    }
}

/// The answer `encode_response`'s body makes, with the direct route's header lines.
fn http_infer_answer(body: Vec<u8>, json_length: Option<usize>) -> Answer {
    let mut lines = Vec::with_capacity(128);
    lines.extend_from_slice(b"content-type: ");
    lines.extend_from_slice(if json_length.is_some() {
        crate::encode::BINARY
    } else {
        crate::encode::JSON
    });
    lines.extend_from_slice(b"\r\ncontent-length: ");
    lines.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    lines.extend_from_slice(b"\r\n");
    if let Some(length) = json_length {
        lines.extend_from_slice(b"inference-header-content-length: ");
        lines.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
        lines.extend_from_slice(b"\r\n");
    }
    Answer::Http {
        status: 200,
        lines,
        body,
    }
}

fn http_answer(status: u16, headers: &[(Vec<u8>, Vec<u8>)], body: Vec<u8>) -> Answer {
    let mut lines = Vec::with_capacity(96);
    let mut push = |name: &[u8], value: &[u8]| {
        lines.extend_from_slice(name);
        lines.extend_from_slice(b": ");
        lines.extend_from_slice(value);
        lines.extend_from_slice(b"\r\n");
    };
    let has_length = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case(b"content-length"));
    let mut rest = headers;
    if let Some((name, value)) = headers.first() {
        if name.eq_ignore_ascii_case(b"content-type") {
            push(name, value);
            rest = &headers[1..];
        }
    }
    if !has_length {
        push(
            b"content-length",
            itoa::Buffer::new().format(body.len()).as_bytes(),
        );
    }
    for (name, value) in rest {
        push(name, value);
    }
    Answer::Http {
        status,
        lines,
        body,
    }
}

/// numpy's array type and the native dtype of each output type, looked up once (None when
/// numpy cannot be imported: every output is then read through the buffer protocol).
struct Numpy {
    ndarray: Py<PyAny>,
    dtypes: Vec<(OutputType, Py<PyAny>)>,
}

static NUMPY: pyo3::sync::PyOnceLock<Option<Numpy>> = pyo3::sync::PyOnceLock::new();

fn numpy(py: Python<'_>) -> Option<&Numpy> {
    NUMPY
        .get_or_init(py, || {
            let module = py.import("numpy").ok()?;
            let ndarray = module.getattr("ndarray").ok()?.unbind();
            let dtype = module.getattr("dtype").ok()?;
            let mut dtypes = Vec::new();
            for name in [
                "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                "FP16", "FP32", "FP64",
            ] {
                let kind = OutputType::parse(name)?;
                let numpy_name = match name {
                    "BOOL" => "bool".to_string(),
                    "FP16" => "float16".to_string(),
                    "FP32" => "float32".to_string(),
                    "FP64" => "float64".to_string(),
                    other => other.to_lowercase(),
                };
                dtypes.push((kind, dtype.call1((numpy_name,)).ok()?.unbind()));
            }
            Some(Numpy { ndarray, dtypes })
        })
        .as_ref()
}

/// An output's bytes, row-major: a numpy array of the datatype's native dtype by its
/// `tobytes()` (numpy's buffer export costs three times as much for a small array), any
/// other object through the buffer protocol, checked against the datatype.
fn output_bytes(array: &Bound<'_, PyAny>, datatype: OutputType, name: &str) -> PyResult<Vec<u8>> {
    let py = array.py();
    if let Some(numpy) = numpy(py) {
        if array.get_type().is(&numpy.ndarray) {
            let expected = numpy.dtypes.iter().find(|(kind, _)| *kind == datatype);
            let dtype = array.getattr(pyo3::intern!(py, "dtype"))?;
            if expected.is_some_and(|(_, native)| dtype.is(native)) {
                let bytes = array.call_method0(pyo3::intern!(py, "tobytes"))?;
                return Ok(bytes.cast::<PyBytes>()?.as_bytes().to_vec());
            }
        }
    }
    buffer_bytes(array, datatype, name)
}

/// `output_bytes` through the buffer protocol (C-contiguous, the datatype's element type).
fn buffer_bytes(array: &Bound<'_, PyAny>, datatype: OutputType, name: &str) -> PyResult<Vec<u8>> {
    use pyo3::buffer::{PyBuffer, PyUntypedBuffer};
    let py = array.py();
    let Ok(buffer) = PyUntypedBuffer::get(array) else {
        return via_memoryview(array, datatype, name);
    };
    let format = buffer.format().to_string_lossy().into_owned();
    let code = format.trim_start_matches(['<', '=', '@']);
    let itemsize = buffer.item_size();
    let fits = itemsize == datatype.itemsize()
        && match datatype {
            OutputType::Bool => code == "?",
            OutputType::Number(number) => {
                use crate::plain::DataType::*;
                match number {
                    Fp16 => code == "e",
                    Fp32 => code == "f",
                    Fp64 => code == "d",
                    Int8 | Int16 | Int32 | Int64 => ["b", "h", "i", "l", "q"].contains(&code),
                    Uint8 | Uint16 | Uint32 | Uint64 => ["B", "H", "I", "L", "Q"].contains(&code),
                }
            }
        };
    if !fits {
        return Err(PyValueError::new_err(format!(
            "output {name:?}: {} needs an array of that element type; got format {format:?} \
             of {itemsize} bytes",
            datatype.name()
        )));
    }
    if !buffer.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "output {name:?}: the array must be C-contiguous"
        )));
    }
    if buffer.len_bytes() == 0 {
        return Ok(Vec::new());
    }
    // Copied as the element type the buffer declares (the platform is little-endian, the
    // wire's order), through a typed view; FP16 has no Rust type: its bytes, as a memoryview.
    fn typed<T: pyo3::buffer::Element + bytemuck::Pod>(
        py: Python<'_>,
        buffer: PyUntypedBuffer,
    ) -> PyResult<Vec<u8>> {
        let typed: PyBuffer<T> = buffer.into_typed()?;
        let values = typed.to_vec(py)?;
        Ok(bytemuck::cast_slice::<T, u8>(&values).to_vec())
    }
    match (code, itemsize) {
        ("f", 4) => typed::<f32>(py, buffer),
        ("d", 8) => typed::<f64>(py, buffer),
        ("B", 1) => typed::<u8>(py, buffer),
        ("b", 1) => typed::<i8>(py, buffer),
        (_, 2) if code != "e" && code.chars().all(|c| c.is_ascii_lowercase()) => {
            typed::<i16>(py, buffer)
        }
        (_, 2) if code != "e" => typed::<u16>(py, buffer),
        (_, 4) if code.chars().all(|c| c.is_ascii_lowercase()) => typed::<i32>(py, buffer),
        (_, 4) => typed::<u32>(py, buffer),
        (_, 8) if code.chars().all(|c| c.is_ascii_lowercase()) => typed::<i64>(py, buffer),
        (_, 8) => typed::<u64>(py, buffer),
        _ => {
            drop(buffer);
            let view = py
                .import("builtins")?
                .getattr("memoryview")?
                .call1((array,))?;
            let flat = view.call_method1("cast", ("B",))?;
            PyBuffer::<u8>::get(&flat)?.to_vec(py)
        }
    }
}

/// What `output_bytes` does for a buffer PyO3 does not read (a 0-d array: no shape).
fn via_memoryview(array: &Bound<'_, PyAny>, datatype: OutputType, name: &str) -> PyResult<Vec<u8>> {
    let py = array.py();
    let view = py
        .import("builtins")?
        .getattr("memoryview")?
        .call1((array,))?;
    let format: String = view.getattr("format")?.extract()?;
    let itemsize: usize = view.getattr("itemsize")?.extract()?;
    if itemsize != datatype.itemsize() {
        return Err(PyValueError::new_err(format!(
            "output {name:?}: {} needs an array of that element type; got format {format:?} \
             of {itemsize} bytes",
            datatype.name()
        )));
    }
    let bytes = view.call_method0("tobytes")?;
    bytes.extract::<Vec<u8>>()
}

/// An output read from Python: name, shape, element type, bytes.
type ReadOutput = (String, Vec<i64>, OutputType, Vec<u8>);

type OutputTuple<'py> = (String, String, Vec<i64>, Bound<'py, PyAny>);

/// The encoders' views of outputs read from Python.
fn output_views(read: &[ReadOutput]) -> Vec<Output<'_>> {
    read.iter()
        .map(|(name, shape, datatype, data)| Output {
            name,
            datatype: *datatype,
            shape,
            data,
        })
        .collect()
}

/// Outputs given as (name, datatype, shape, array), read (for the differential tests).
fn read_output_tuples(outputs: &[OutputTuple<'_>]) -> PyResult<Vec<ReadOutput>> {
    outputs
        .iter()
        .map(|(name, datatype, shape, array)| {
            let kind = OutputType::parse(datatype)
                .ok_or_else(|| PyValueError::new_err(format!("datatype {datatype}")))?;
            Ok((
                name.clone(),
                shape.clone(),
                kind,
                output_bytes(array, kind, name)?,
            ))
        })
        .collect()
}

/// The arrays of `outputs` read under the GIL, each with its name, shape and datatype.
fn read_outputs(outputs: Vec<OutputTuple<'_>>) -> PyResult<Vec<ReadOutput>> {
    let mut read = Vec::with_capacity(outputs.len());
    for (name, datatype, shape, array) in outputs {
        let Some(kind) = OutputType::parse(&datatype) else {
            return Err(PyValueError::new_err(format!(
                "output {name:?}: datatype {datatype:?} is not encoded natively; \
                 answer with answer_http or answer_grpc"
            )));
        };
        let data = output_bytes(&array, kind, &name)?;
        read.push((name, shape, kind, data));
    }
    Ok(read)
}

impl Call {
    /// Encodes outputs read already and sends them, without the GIL; gives the call's open
    /// part back with the reason when they cannot be encoded.
    fn send_outputs(
        &self,
        model_name: &str,
        model_version: Option<&str>,
        read: &[ReadOutput],
        open: Open,
    ) -> Result<(), (String, Open)> {
        let views = output_views(read);
        let id = self.id.as_deref();
        let answer = if self.is_grpc {
            crate::encode::grpc_message(model_name, model_version, id, &views).map(|body| {
                Answer::Grpc {
                    code: 0,
                    message: String::new(),
                    body: Some(body),
                }
            })
        } else {
            crate::encode::http_body(model_name, model_version, id, &views, &open.asked)
                .map(|(body, json_length)| http_infer_answer(body, json_length))
        };
        match answer {
            Ok(answer) => {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                // The body's bytes are given back before the answer can reach the client.
                let Open { reply, _held, .. } = open;
                drop(_held);
                // A client that went away dropped its end: nothing to do.
                let _ = reply.send(answer);
                Ok(())
            }
            Err(message) => Err((message, open)),
        }
    }
}

/// One call's answer for `answer_all`: the call, the model's name and version, the outputs.
type CallAnswer<'py> = (
    Bound<'py, Call>,
    String,
    Option<String>,
    Vec<OutputTuple<'py>>,
);

/// Answers many calls with their outputs at once, as `Call.answer` answers each, with one
/// release of the GIL for all their encodings and sends (a batch's answers, from the compute
/// worker that ran it). Returns the indexes of the calls left open because an output could
/// not be encoded (for `answer_http` / `answer_grpc`); a call answered already is skipped.
#[pyfunction]
fn answer_all(py: Python<'_>, answers: Vec<CallAnswer<'_>>) -> Vec<usize> {
    let mut ready = Vec::with_capacity(answers.len());
    let mut left = Vec::new();
    for (index, (call, model_name, model_version, outputs)) in answers.into_iter().enumerate() {
        let call = call.unbind();
        let Some(open) = call.get().open.lock().take() else {
            continue; // answered already (the drain's answer, say)
        };
        match read_outputs(outputs) {
            Ok(read) => ready.push((index, call, model_name, model_version, read, open)),
            Err(_) => {
                *call.get().open.lock() = Some(open);
                left.push(index);
            }
        }
    }
    // The calls come back out of the closure: their references are dropped with the GIL.
    let (failed, _calls) = py.detach(|| {
        let mut failed = Vec::new();
        let mut calls = Vec::with_capacity(ready.len());
        for (index, call, model_name, model_version, read, open) in ready {
            let sent = call
                .get()
                .send_outputs(&model_name, model_version.as_deref(), &read, open);
            if let Err((_, open)) = sent {
                *call.get().open.lock() = Some(open);
                failed.push(index);
            }
            calls.push(call);
        }
        (failed, calls)
    });
    left.extend(failed);
    left.sort_unstable();
    left
}

#[pymethods]
impl Call {
    /// Encodes `outputs` and sends them: HTTP JSON (binary where asked) exactly as corral's
    /// `encode_response`, or a gRPC ModelInferResponse. Raises ValueError (the call stays
    /// open) for an output it cannot encode, RuntimeError if the call was answered already.
    #[pyo3(signature = (model_name, model_version, outputs))]
    fn answer(
        &self,
        py: Python<'_>,
        model_name: &str,
        model_version: Option<&str>,
        outputs: Vec<OutputTuple<'_>>,
    ) -> PyResult<()> {
        // Taken at once, so that a second answer from another thread fails; put back if the
        // outputs cannot be encoded (the call stays open for answer_http / answer_grpc).
        let Some(open) = self.open.lock().take() else {
            return Err(Self::answered_already());
        };
        let read = match read_outputs(outputs) {
            Ok(read) => read,
            Err(error) => {
                *self.open.lock() = Some(open);
                return Err(error);
            }
        };
        // One release of the GIL for the encoding and the send: the arrays were read above.
        let sent = py.detach(|| self.send_outputs(model_name, model_version, &read, open));
        sent.map_err(|(message, open)| {
            *self.open.lock() = Some(open);
            PyValueError::new_err(message)
        })
    }

    /// Sends an HTTP answer Python made: status, header lines in order (content-length is
    /// added after a first content-type unless given), body.
    fn answer_http(
        &self,
        py: Python<'_>,
        status: u16,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        body: Vec<u8>,
    ) -> PyResult<()> {
        if self.is_grpc {
            return Err(PyValueError::new_err(
                "answer_http answers an HTTP call; this one is gRPC",
            ));
        }
        let answer = http_answer(status, &headers, body);
        if py.detach(|| self.finish(answer)) {
            Ok(())
        } else {
            Err(Self::answered_already())
        }
    }

    /// Sends a gRPC answer: code 0 with a serialized ModelInferResponse, or a status.
    #[pyo3(signature = (code, message, response=None))]
    fn answer_grpc(
        &self,
        py: Python<'_>,
        code: u32,
        message: String,
        response: Option<Vec<u8>>,
    ) -> PyResult<()> {
        if !self.is_grpc {
            return Err(PyValueError::new_err(
                "answer_grpc answers a gRPC call; this one is HTTP",
            ));
        }
        let answer = Answer::Grpc {
            code,
            message,
            body: response,
        };
        if py.detach(|| self.finish(answer)) {
            Ok(())
        } else {
            Err(Self::answered_already())
        }
    }

    /// Hands the request to the Python edge as it came (head and body, or the gRPC message),
    /// which answers it in its own words: for what only the general way does (a model to load
    /// first, an answer only Python's encoder makes).
    fn bridge(&self, py: Python<'_>) -> PyResult<()> {
        if py.detach(|| self.finish(Answer::Bridge)) {
            Ok(())
        } else {
            Err(Self::answered_already())
        }
    }

    /// The requested outputs, `(name, binary_data)`; empty when none is named.
    #[getter]
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.requested)
    }

    #[getter]
    fn answered(&self) -> bool {
        self.open.lock().is_none()
    }

    fn __repr__(&self) -> String {
        format!("Call(protocol={:?}, id={:?})", self.protocol, self.id)
    }
}

/// The calls of one model version taken in one round, in arrival order.
#[pyclass(module = "corral_edge", frozen)]
pub struct Group {
    #[pyo3(get)]
    model: String,
    #[pyo3(get)]
    version: Option<String>,
    #[pyo3(get)]
    calls: Py<PyList>,
    #[pyo3(get)]
    alone: bool,
}

#[pymethods]
impl Group {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Group(model={:?}, version={:?}, calls={}, alone={})",
            self.model,
            self.version,
            self.calls.bind(py).len(),
            self.alone
        )
    }
}

fn make_call<'py>(
    py: Python<'py>,
    pending: Pending,
    base: (Instant, u64),
    in_flight: &Arc<AtomicUsize>,
) -> PyResult<Bound<'py, Call>> {
    let request = pending.request;
    let inputs = PyList::empty(py);
    for tensor in request.inputs {
        inputs.append(Bound::new(
            py,
            Tensor {
                name: tensor.name,
                datatype: tensor.datatype.name(),
                shape: tensor.shape,
                storage: tensor.data,
            },
        )?)?;
    }
    let since = pending.received.saturating_duration_since(base.0);
    let received_ns = base
        .1
        .saturating_add(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX));
    let is_grpc = pending.protocol == Protocol::Grpc;
    Bound::new(
        py,
        Call {
            protocol: if is_grpc { "grpc" } else { "http" },
            id: request.id,
            inputs: inputs.unbind(),
            requested: request.outputs.clone(),
            binary_data_output: request.binary_data_output,
            timeout_us: pending.timeout_us,
            received_ns,
            is_grpc,
            open: Mutex::new(Some(Open {
                reply: pending.reply,
                _held: pending.held,
                asked: Asked {
                    outputs: request.outputs,
                    binary_data_output: request.binary_data_output,
                },
            })),
            in_flight: Arc::clone(in_flight),
        },
    )
}

/// The native edge (see the module's README).
#[pyclass(module = "corral_edge", frozen)]
pub struct Edge {
    shared: Arc<Shared>,
    listeners: Mutex<(Option<std::net::TcpListener>, Option<std::net::TcpListener>)>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    threads: usize,
    in_flight: Arc<AtomicUsize>,
    base: (Instant, u64),
    started: std::sync::atomic::AtomicBool,
}

/// A listening socket made by Python, duplicated: the edge owns the duplicate.
fn adopt(fd: i32) -> PyResult<std::net::TcpListener> {
    use std::os::fd::BorrowedFd;
    if fd < 0 {
        return Err(PyValueError::new_err(format!(
            "{fd} is not a file descriptor"
        )));
    }
    // SAFETY: the caller passes the fileno of a socket it keeps open for the duration of
    // this call (the API's contract: Python made the socket and holds it); the fd is only
    // borrowed here, to duplicate it (F_DUPFD_CLOEXEC), and never closed through the borrow.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let owned = borrowed
        .try_clone_to_owned()
        .map_err(|e| PyValueError::new_err(format!("file descriptor {fd}: {e}")))?;
    let listener = std::net::TcpListener::from(owned);
    listener.local_addr().map_err(|e| {
        PyValueError::new_err(format!("file descriptor {fd} is not a TCP socket: {e}"))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(listener)
}

fn seconds(value: f64, name: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!("{name} must be a non-negative number of seconds"))
    })
}

#[pymethods]
impl Edge {
    #[new]
    #[pyo3(signature = (
        *, http_fd, grpc_fd, http_bridge, grpc_bridge, budget, threads=1, native_infer=true,
        auth=None, allowed_hosts=None, max_url_bytes, max_header_bytes, header_timeout_s,
        idle_timeout_s, max_connections, body_timeout_s, max_request_bytes,
        body_min_rate_bytes_s=1024,
        native_body_bytes=1<<20, max_pending=4096, grpc_max_connections, grpc_idle_timeout_s,
        grpc_handshake_timeout_s, grpc_keepalive_time_s, grpc_keepalive_timeout_s,
        grpc_min_ping_interval_s=10.0, grpc_max_concurrent_streams, grpc_max_message_bytes,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        http_fd: Option<i32>,
        grpc_fd: Option<i32>,
        http_bridge: Option<String>,
        grpc_bridge: Option<String>,
        budget: &PyBudget,
        threads: usize,
        native_infer: bool,
        auth: Option<Vec<Vec<u8>>>,
        allowed_hosts: Option<Vec<String>>,
        max_url_bytes: usize,
        max_header_bytes: usize,
        header_timeout_s: f64,
        idle_timeout_s: f64,
        max_connections: usize,
        body_timeout_s: f64,
        max_request_bytes: usize,
        body_min_rate_bytes_s: u64,
        native_body_bytes: usize,
        max_pending: usize,
        grpc_max_connections: Option<usize>,
        grpc_idle_timeout_s: f64,
        grpc_handshake_timeout_s: f64,
        grpc_keepalive_time_s: f64,
        grpc_keepalive_timeout_s: f64,
        grpc_min_ping_interval_s: f64,
        grpc_max_concurrent_streams: Option<u32>,
        grpc_max_message_bytes: usize,
    ) -> PyResult<Self> {
        let hosts = HostPolicy::new(allowed_hosts.as_deref()).map_err(PyValueError::new_err)?;
        let config = Config {
            native_infer,
            auth,
            hosts,
            max_url_bytes,
            max_header_bytes,
            header_timeout: seconds(header_timeout_s, "header_timeout_s")?,
            header_timeout_s,
            idle_timeout: seconds(idle_timeout_s, "idle_timeout_s")?,
            max_connections,
            body_timeout: seconds(body_timeout_s, "body_timeout_s")?,
            body_timeout_s,
            body_min_rate_bytes_s,
            max_request_bytes,
            native_body_bytes,
            max_pending,
            http_bridge,
            grpc_bridge,
            grpc_max_connections,
            grpc_idle_timeout: seconds(grpc_idle_timeout_s, "grpc_idle_timeout_s")?,
            grpc_handshake_timeout: seconds(grpc_handshake_timeout_s, "grpc_handshake_timeout_s")?,
            grpc_keepalive_time: seconds(grpc_keepalive_time_s, "grpc_keepalive_time_s")?,
            grpc_keepalive_timeout: seconds(grpc_keepalive_timeout_s, "grpc_keepalive_timeout_s")?,
            grpc_min_ping_interval: seconds(grpc_min_ping_interval_s, "grpc_min_ping_interval_s")?,
            grpc_max_concurrent_streams,
            grpc_max_message_bytes,
        };
        let http = http_fd.map(adopt).transpose()?;
        let grpc = grpc_fd.map(adopt).transpose()?;
        // Python's time.monotonic_ns() and Rust's Instant read the same clock
        // (CLOCK_MONOTONIC): one pair of readings maps every Instant to Python's ns.
        let base_ns: u64 = py.import("time")?.call_method0("monotonic_ns")?.extract()?;
        let base = (Instant::now(), base_ns);
        Ok(Self {
            shared: Arc::new(Shared::new(config, Arc::clone(&budget.inner))),
            listeners: Mutex::new((http, grpc)),
            runtime: Mutex::new(None),
            threads: threads.max(1),
            in_flight: Arc::new(AtomicUsize::new(0)),
            base,
            started: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Starts the runtime's threads and the accept loops.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        if self.started.swap(true, Ordering::SeqCst) {
            return Err(PyRuntimeError::new_err("the edge was started already"));
        }
        let (http, grpc) = {
            let mut listeners = self.listeners.lock();
            (listeners.0.take(), listeners.1.take())
        };
        let shared = Arc::clone(&self.shared);
        let threads = self.threads;
        let runtime = py.detach(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name("corral-edge")
                .enable_all()
                .build()
        });
        let runtime = runtime.map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let _entered = runtime.enter();
        if let Some(listener) = http {
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            runtime.spawn(crate::server::accept_http(listener, Arc::clone(&shared)));
        }
        if let Some(listener) = grpc {
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            runtime.spawn(crate::grpc::accept(listener, Arc::clone(&shared)));
        }
        drop(_entered);
        *self.runtime.lock() = Some(runtime);
        Ok(())
    }

    /// Every call pending, grouped by model version in arrival order; waits up to
    /// `timeout_s` for the first (the GIL released); [] on timeout.
    fn take<'py>(&self, py: Python<'py>, timeout_s: f64) -> PyResult<Bound<'py, PyList>> {
        let timeout = Duration::try_from_secs_f64(timeout_s.max(0.0)).unwrap_or(Duration::MAX / 4);
        // Calls waiting already are taken at once; the GIL is released only to wait.
        let mut pending = self.shared.queue.try_take();
        if pending.is_empty() {
            let shared = Arc::clone(&self.shared);
            pending = py.detach(move || shared.queue.take(timeout));
        }
        let groups = PyList::empty(py);
        if pending.is_empty() {
            return Ok(groups);
        }
        let before = self.in_flight.fetch_add(pending.len(), Ordering::SeqCst);
        let alone = pending.len() == 1 && before == 0;
        // Few model versions in one round: a list searched in order keeps their first
        // arrival's order, without hashing each call's names.
        let mut order: Vec<(String, Option<String>, Bound<'py, PyList>)> = Vec::new();
        for call in pending {
            let at = order
                .iter()
                .position(|(model, version, _)| *model == call.model && *version == call.version);
            let at = match at {
                Some(at) => at,
                None => {
                    order.push((call.model.clone(), call.version.clone(), PyList::empty(py)));
                    order.len() - 1
                }
            };
            let made = make_call(py, call, self.base, &self.in_flight)?;
            order[at].2.append(made)?;
        }
        for (model, version, calls) in order {
            groups.append(Group {
                model,
                version,
                calls: calls.unbind(),
                alone,
            })?;
        }
        Ok(groups)
    }

    /// What the edge has to say in corral's log since this was last called: (level, text)
    /// pairs, oldest first, the levels Python's logging levels.
    fn notices(&self) -> Vec<(u8, String)> {
        self.shared.notices.take()
    }

    /// Calls taken by Python and not yet answered.
    #[getter]
    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Stops accepting, answers what was accepted within `timeout_s`, closes idle
    /// connections; returns how many requests were cut (answered 503 / UNAVAILABLE).
    fn drain(&self, py: Python<'_>, timeout_s: f64) -> usize {
        let shared = Arc::clone(&self.shared);
        let in_flight = Arc::clone(&self.in_flight);
        let timeout = Duration::try_from_secs_f64(timeout_s.max(0.0)).unwrap_or(Duration::MAX / 4);
        py.detach(move || crate::server::drain(&shared, &in_flight, timeout))
    }

    /// Stops the edge (idempotent): every connection ends, the runtime's threads are joined.
    fn stop(&self, py: Python<'_>) {
        self.shared.stopping.raise();
        self.shared.draining.raise();
        self.shared.queue.close();
        let runtime = self.runtime.lock().take();
        if let Some(runtime) = runtime {
            py.detach(move || runtime.shutdown_timeout(Duration::from_secs(2)));
        }
        self.listeners.lock().0.take();
        self.listeners.lock().1.take();
    }

    /// Counters: connections open (http, grpc), requests native and bridged, calls refused
    /// for max_pending, panics caught, bytes in and out, requests cut by the drain.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = &self.shared.stats;
        let dict = PyDict::new(py);
        let read = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        dict.set_item("http_connections", self.shared.slots.lock().len())?;
        dict.set_item(
            "grpc_connections",
            self.shared.grpc_open.load(Ordering::Relaxed),
        )?;
        dict.set_item("requests_native", read(&stats.native))?;
        dict.set_item("requests_bridged", read(&stats.bridged))?;
        dict.set_item("refused_pending", read(&stats.refused_pending))?;
        dict.set_item("panics", read(&stats.panics))?;
        dict.set_item("bytes_in", read(&stats.bytes_in))?;
        dict.set_item("bytes_out", read(&stats.bytes_out))?;
        dict.set_item("cut", read(&stats.cut))?;
        dict.set_item("notices_dropped", read(&self.shared.notices.dropped))?;
        dict.set_item("in_flight", self.in_flight.load(Ordering::SeqCst))?;
        Ok(dict)
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        self.shared.stopping.raise();
        self.shared.queue.close();
        if let Some(runtime) = self.runtime.lock().take() {
            runtime.shutdown_background();
        }
    }
}

/// The native decoder, for the differential tests: None (not plain: the bridge) or a dict
/// of what the call would carry.
#[pyfunction]
fn _decode_http<'py>(
    py: Python<'py>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let mut header_length = None;
    let mut count = 0;
    for (name, value) in &headers {
        if name.eq_ignore_ascii_case(b"inference-header-content-length") {
            count += 1;
            if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
                return Ok(None);
            }
            header_length = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
        }
    }
    if count > 1 {
        return Ok(None);
    }
    let Some(request) = decode_http(&Bytes::from(body), header_length) else {
        return Ok(None);
    };
    let dict = PyDict::new(py);
    dict.set_item("id", request.id)?;
    let inputs = PyList::empty(py);
    for tensor in request.inputs {
        let data = PyBytes::new(py, tensor.data.as_bytes());
        inputs.append((
            tensor.name,
            tensor.datatype.name(),
            PyTuple::new(py, &tensor.shape)?,
            data,
        ))?;
    }
    dict.set_item("inputs", inputs)?;
    dict.set_item("outputs", request.outputs)?;
    dict.set_item("binary_data_output", request.binary_data_output)?;
    Ok(Some(dict))
}

/// The native HTTP encoder, for the differential tests: (body, json_length or None).
#[pyfunction]
#[pyo3(signature = (model_name, model_version, id, outputs, requested, binary_data_output))]
fn _encode_http<'py>(
    py: Python<'py>,
    model_name: &str,
    model_version: Option<&str>,
    id: Option<&str>,
    outputs: Vec<OutputTuple<'py>>,
    requested: Vec<(String, Option<bool>)>,
    binary_data_output: bool,
) -> PyResult<(Bound<'py, PyBytes>, Option<usize>)> {
    let read = read_output_tuples(&outputs)?;
    let views = output_views(&read);
    let asked = Asked {
        outputs: requested,
        binary_data_output,
    };
    let (body, length) = crate::encode::http_body(model_name, model_version, id, &views, &asked)
        .map_err(PyValueError::new_err)?;
    Ok((PyBytes::new(py, &body), length))
}

/// The native gRPC encoder, for the differential tests.
#[pyfunction]
fn _encode_grpc<'py>(
    py: Python<'py>,
    model_name: &str,
    model_version: Option<&str>,
    id: Option<&str>,
    outputs: Vec<OutputTuple<'py>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let read = read_output_tuples(&outputs)?;
    let views = output_views(&read);
    let body = crate::encode::grpc_message(model_name, model_version, id, &views)
        .map_err(PyValueError::new_err)?;
    Ok(PyBytes::new(py, &body))
}

/// `origins.host_name`, for the differential tests.
#[pyfunction]
fn _host_name(value: &str) -> Option<String> {
    crate::hosts::host_name(value)
}

/// `SitePolicy(allowed_hosts).allows(host)` of a raw Host value, for the differential tests.
#[pyfunction]
fn _allows(allowed_hosts: Option<Vec<String>>, host: Vec<u8>) -> PyResult<bool> {
    let policy = HostPolicy::new(allowed_hosts.as_deref()).map_err(PyValueError::new_err)?;
    Ok(policy.allows(&host))
}

/// The gRPC plain check, for the differential tests: None, or (model, version, id, inputs).
#[pyfunction]
fn _decode_grpc<'py>(py: Python<'py>, message: Vec<u8>) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(call) = crate::grpc::decode_plain(Bytes::from(message)) else {
        return Ok(None);
    };
    let dict = PyDict::new(py);
    dict.set_item("model", call.model)?;
    dict.set_item("version", call.version)?;
    dict.set_item("id", call.request.id)?;
    let inputs = PyList::empty(py);
    for tensor in call.request.inputs {
        let data = PyBytes::new(py, tensor.data.as_bytes());
        inputs.append((
            tensor.name,
            tensor.datatype.name(),
            PyTuple::new(py, &tensor.shape)?,
            data,
        ))?;
    }
    dict.set_item("inputs", inputs)?;
    dict.set_item("outputs", call.request.outputs)?;
    Ok(Some(dict))
}

/// A test hook: native requests for `model` panic in the edge (None: off). Every Edge of the
/// process is armed.
#[pyfunction]
fn _panic_on_model(model: Option<String>) {
    *crate::shared::PANIC_MODEL.lock() = model;
}

#[pymodule]
fn corral_edge(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add_class::<PyBudget>()?;
    module.add_class::<Edge>()?;
    module.add_class::<Group>()?;
    module.add_class::<Call>()?;
    module.add_class::<Tensor>()?;
    module.add_function(wrap_pyfunction!(answer_all, module)?)?;
    module.add_function(wrap_pyfunction!(_decode_http, module)?)?;
    module.add_function(wrap_pyfunction!(_encode_http, module)?)?;
    module.add_function(wrap_pyfunction!(_encode_grpc, module)?)?;
    module.add_function(wrap_pyfunction!(_decode_grpc, module)?)?;
    module.add_function(wrap_pyfunction!(_host_name, module)?)?;
    module.add_function(wrap_pyfunction!(_allows, module)?)?;
    module.add_function(wrap_pyfunction!(_panic_on_model, module)?)?;
    Ok(())
}
