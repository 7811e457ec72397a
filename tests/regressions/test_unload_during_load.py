"""A model dropped while another loads: the garbage collector may run the dropped model's __del__ (which closes its
library under the loader's lock) inside ctypes.CDLL's allocations while kiln.runtime.load holds that lock in the same
thread. With a plain lock the thread waited on itself forever (a CI run hung in tests/hostile); the lock is
reentrant now (kiln/runtime/package.py)."""

import gc
import threading

import kiln
import kiln.nn as nn
from kiln.runtime import package as runtime_package


def test_a_model_unloaded_while_another_loads_does_not_hang(tmp_path):
    program = kiln.export(nn.Linear(4, 3).eval(), (kiln.randn(2, 4),))
    folder = tmp_path / "pkg"
    kiln.compile(program, output=folder)
    models = [kiln.runtime.load(folder)]
    finished = threading.Event()

    def load_while_the_first_is_collected():
        gc.disable()  # the collection happens where the loader holds its lock, as it did in CI
        try:
            with runtime_package._LOADED_FILES_LOCK:
                models.pop()  # the last reference: __del__ closes the library here, under the held lock
                gc.collect()
                models.append(kiln.runtime.load(folder))
        finally:
            gc.enable()
        finished.set()

    worker = threading.Thread(target=load_while_the_first_is_collected, daemon=True)
    worker.start()
    assert finished.wait(timeout=60), "unloading a model under the loader's lock hung"
    x = kiln.randn(2, 4).numpy()
    kiln.testing.assert_close(models[0](x), program(x))
