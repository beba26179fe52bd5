"""Offline text-to-speech: espeak-ng through ctypes, with the synthesiser's own timing.

The library and its voice data come from the ``espeakng-loader`` wheel (the ``demo`` extra),
else from the system (Debian and Ubuntu: ``libespeak-ng1`` with ``espeak-ng-data``); with
neither, :func:`synthesize` raises :class:`~sfu_sidecar.exceptions.TtsUnavailable`. Nothing is
downloaded.

espeak-ng speaks at 22050 Hz; an utterance comes back at 48 kHz (:mod:`sfu_sidecar.resample`),
the rate WebRTC's Opus runs at. Its timing is espeak-ng's own: every word event of the synth
callback names the output sample the word begins at (``sample``; ``audio_position`` is the
same in whole milliseconds). A word's start includes silence before its first sound (the
closure of a /k/, the pause after a comma), so an utterance's onset is the first sample louder
than :data:`SOUND_THRESHOLD` from its first word on.

The library keeps one global state (voice, rate, callback) and is not re-entrant: it is loaded
and initialised once per process, and every call holds one lock. Synthesis is CPU work (about
15 ms per second of speech with the resampling): call it off the event loop.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sfu_sidecar.exceptions import TtsError, TtsUnavailable
from sfu_sidecar.resample import resample

RATE = 48_000
# |sample| in espeak-ng's int16 output above which sound has begun: -54 dBFS, below any
# phoneme's first period and above the resampler's pre-ringing.
SOUND_THRESHOLD = 64
SYSTEM_LIBRARY = "libespeak-ng.so.1"
# espeakRATE's range in words per minute (speak_lib.h: espeakRATE_MINIMUM, _MAXIMUM).
MIN_WPM, MAX_WPM = 80, 450

# speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # return an error instead of exit() when data is missing
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAMETER_RATE = 1
_EE_OK = 0
_EVENT_LIST_TERMINATED, _EVENT_WORD, _EVENT_SENTENCE = 0, 1, 2


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p),
                ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    """espeak_EVENT. ``sample`` counts output samples from the start of the text;
    ``text_position`` counts characters from 1 and ``length`` is the word's in characters."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


class _Voice(ctypes.Structure):
    """espeak_VOICE: ``languages`` selects by language when the name is not a voice's."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_char_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


@dataclass(frozen=True)
class Word:
    """A word and the sample (at the utterance's rate) where espeak-ng begins it."""

    start: int
    text: str


@dataclass(frozen=True)
class Utterance:
    """Mono int16 PCM at ``rate`` with espeak-ng's timing, in samples of that PCM: ``onset``
    is the first sounding sample, ``end`` is just after the last one (both 0 when silent)."""

    text: str
    voice: str
    wpm: int
    pcm: npt.NDArray[np.int16]
    words: tuple[Word, ...]
    onset: int
    end: int
    rate: int = RATE

    @property
    def silent(self) -> bool:
        return self.end <= self.onset


class _Engine:
    """One loaded and initialised espeak-ng; callers hold ``_lock``."""

    def __init__(self, lib: ctypes.CDLL, data_path: str | None, origin: str) -> None:
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                          ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetVoiceByProperties.argtypes = [ctypes.POINTER(_Voice)]
        lib.espeak_SetVoiceByProperties.restype = ctypes.c_int
        lib.espeak_GetCurrentVoice.argtypes = []
        lib.espeak_GetCurrentVoice.restype = ctypes.POINTER(_Voice)
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint,
                                     ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
                                     ctypes.c_void_p, ctypes.c_void_p]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Synchronize.argtypes = []
        lib.espeak_Synchronize.restype = ctypes.c_int
        lib.espeak_Info.argtypes = [ctypes.c_void_p]
        lib.espeak_Info.restype = ctypes.c_char_p
        path = data_path.encode() if data_path is not None else None
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, path, _INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise TtsUnavailable(f"espeak-ng ({origin}) did not start: voice data missing?")
        self.lib = lib
        self.rate = int(rate)
        version = (lib.espeak_Info(None) or b"?").decode(errors="replace")
        self.description = f"espeak-ng {version} ({origin})"
        self._chunks: list[npt.NDArray[np.int16]] = []
        self._events: list[tuple[int, int, int, int]] = []  # type, sample, position, length
        # Kept referenced: the library calls it for as long as the process lives.
        self._callback = _SynthCallback(self._on_synth)
        lib.espeak_SetSynthCallback(self._callback)

    def _on_synth(self, wav: ctypes._Pointer[ctypes.c_short], count: int,
                  events: ctypes._Pointer[_Event]) -> int:
        if count > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).astype(np.int16))
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            e = events[i]
            if e.type in (_EVENT_WORD, _EVENT_SENTENCE):
                self._events.append((e.type, e.sample, e.text_position, e.length))
            i += 1
        return 0  # go on

    def select(self, voice: str, wpm: int) -> None:
        """Voice by name or file (``en-us``, ``gmw/en``), else by language (``en-gb``, as the
        espeak-ng command does), with its variant (``+f3``) checked, for it would be ignored."""
        base, plus, variant = voice.partition("+")
        if not base or "\0" in voice or (plus and not variant):
            raise TtsError(f"no espeak-ng voice {voice!r}")
        lib = self.lib
        if lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
            spec = _Voice(languages=base.encode())
            if lib.espeak_SetVoiceByProperties(ctypes.byref(spec)) != _EE_OK:
                raise TtsError(f"no espeak-ng voice {voice!r} (try en-us, en-gb, de, fr)")
            found = lib.espeak_GetCurrentVoice().contents.identifier.decode()
            if lib.espeak_SetVoiceByName(f"{found}{plus}{variant}".encode()) != _EE_OK:
                raise TtsError(f"no espeak-ng voice {voice!r}")
        if variant and not lib.espeak_GetCurrentVoice().contents.identifier.decode().endswith(
                f"+{variant}"):
            raise TtsError(f"no espeak-ng voice variant {variant!r} (try f1-f5, m1-m7)")
        lib.espeak_SetParameter(_PARAMETER_RATE, wpm, 0)

    def speak(self, text: str) -> tuple[npt.NDArray[np.int16], list[tuple[int, int, int, int]]]:
        """espeak-ng's own samples for ``text`` and its word and sentence events."""
        self._chunks, self._events = [], []
        data = text.encode()
        status = self.lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8,
                                       None, None)
        self.lib.espeak_Synchronize()
        if status != _EE_OK:
            raise TtsError(f"espeak-ng refused the text (error {status})")
        pcm = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        return pcm, self._events


_lock = threading.Lock()
_engine: _Engine | None = None
_failure: TtsUnavailable | None = None


def _open() -> _Engine:
    """The wheel's library with its data, else the system's with its compiled-in data path."""
    reasons = []
    try:
        import espeakng_loader

        return _Engine(ctypes.CDLL(espeakng_loader.get_library_path()),
                       espeakng_loader.get_data_path(), "espeakng-loader wheel")
    except ImportError:
        reasons.append("the espeakng-loader wheel is not installed")
    except (OSError, RuntimeError, TtsUnavailable) as exc:
        reasons.append(f"the espeakng-loader wheel's library failed: {exc}")
    try:
        return _Engine(ctypes.CDLL(SYSTEM_LIBRARY), None, SYSTEM_LIBRARY)
    except OSError:
        reasons.append(f"no system {SYSTEM_LIBRARY}")
    except TtsUnavailable as exc:
        reasons.append(exc.reason)
    raise TtsUnavailable(
        "no text-to-speech: " + "; ".join(reasons) + " (pip install 'sfu-sidecar[demo]', "
        "or apt-get install libespeak-ng1)")


def _loaded() -> _Engine:
    global _engine, _failure
    if _engine is None:
        if _failure is not None:
            raise _failure
        try:
            _engine = _open()
        except TtsUnavailable as exc:
            _failure = exc
            raise
    return _engine


def engine() -> str:
    """Which espeak-ng speaks: its version and where it was loaded from. Raises
    :class:`~sfu_sidecar.exceptions.TtsUnavailable` when there is none."""
    with _lock:
        return _loaded().description


def synthesize(text: str, voice: str = "en-us", wpm: int = 160) -> Utterance:
    """``text`` spoken by espeak-ng's ``voice`` (a name such as ``en-us``, ``de`` or
    ``en-gb+f3``, a variant after the ``+``) at ``wpm`` words per minute, at 48 kHz.

    Raises :class:`~sfu_sidecar.exceptions.TtsError` for an unknown voice or a rate outside
    80-450 wpm, and its subclass ``TtsUnavailable`` when no espeak-ng is installed. Blank text
    gives an empty utterance. Blocks for the synthesis: from asyncio, run it in a thread."""
    if not MIN_WPM <= wpm <= MAX_WPM:
        raise TtsError(f"wpm must be between {MIN_WPM} and {MAX_WPM}, not {wpm}")
    text = text.replace("\0", " ")
    with _lock:
        eng = _loaded()
        eng.select(voice, wpm)
        if not text.strip():
            return Utterance(text, voice, wpm, np.zeros(0, np.int16), (), 0, 0)
        raw, events = eng.speak(text)
        native = eng.rate

    def at_rate(sample: int) -> int:
        return round(sample * RATE / native)

    words = tuple(Word(at_rate(sample), text[pos - 1:pos - 1 + length])
                  for kind, sample, pos, length in events if kind == _EVENT_WORD)
    # The first sentence or word event: where espeak-ng begins to speak.
    begins = min((sample for _, sample, _, _ in events), default=0)
    loud = np.flatnonzero(np.abs(raw.astype(np.int32)) > SOUND_THRESHOLD)
    loud = loud[loud >= begins]
    pcm = np.clip(np.rint(resample(raw, native, RATE)), -32768, 32767).astype(np.int16)
    if loud.size == 0:
        return Utterance(text, voice, wpm, pcm, words, 0, 0)
    return Utterance(text, voice, wpm, pcm, words, at_rate(int(loud[0])),
                     min(pcm.size, at_rate(int(loud[-1]) + 1)))
