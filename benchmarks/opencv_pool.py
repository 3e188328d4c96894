"""The OpenCV peer script for `imgops bench --pipeline` (a checkout's shortcut to the packaged one).

The script itself lives in src/imgops/bench/opencv_pool.py so that an installed imgops can run it;
it imports nothing from imgops (standard library and cv2 only). Usage:

    $ python benchmarks/opencv_pool.py -d out/ photos/*.jpg            # Pool(os.cpu_count())
    $ python benchmarks/opencv_pool.py -d out/ --jobs 1 photos/*.jpg   # sequential
"""

import runpy
from pathlib import Path

if __name__ == "__main__":
    script = Path(__file__).resolve().parents[1] / "src" / "imgops" / "bench" / "opencv_pool.py"
    runpy.run_path(str(script), run_name="__main__")
