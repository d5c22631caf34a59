"""README's layout table is the tree: every folder of the package and of the repository is in it,
every folder it names exists, and every module it names is in the folder of its row."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def layout_rows(text: str | None = None) -> dict[str, str]:
    """folder -> its row's text, from README's "Layout" table (a row may name several folders)."""
    text = (REPO / "README.md").read_text() if text is None else text
    section = text[text.index("\n## Layout\n"):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| (`[^|]+`) \| (.+) \|$", line)
        if m and m.group(1) != "`folder`":
            for folder in re.findall(r"`([^`]+/)`", m.group(1)):
                rows[folder] = m.group(2)
    return rows


def tracked_folders() -> set[str]:
    """The package's folders that hold Python, and the repository's top-level folders, as git has them."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    out = {f.split("/")[0] + "/" for f in files if "/" in f}
    out |= {str(Path(f).parent) + "/" for f in files if f.startswith("testbed/") and f.endswith(".py")}
    return out


def test_every_folder_is_in_the_layout_table_and_every_row_exists():
    rows = layout_rows()
    assert "testbed/runtimes/netns/" in rows and "testbed/node/fleet/" in rows
    assert sorted(tracked_folders() - set(rows)) == []
    assert sorted(f for f in rows if not (REPO / f).is_dir()) == []


def test_every_module_a_package_row_names_is_in_its_folder():
    missing = []
    for folder, text in layout_rows().items():
        if folder.startswith("testbed/"):
            for module in re.findall(r"`(\w+\.py)`", text):
                if not (REPO / folder / module).is_file():
                    missing.append(folder + module)
    assert missing == []


def test_the_table_reader_takes_each_folder_of_a_row_and_stops_at_the_next_section():
    text = ("# x\n\n## Layout\n\n| folder | what |\n|---|---|\n| `testbed/node/` | `launch.py` (gone) |\n"
            "| `images/`, `compose/` | the image |\n\n## Next\n\n| `later/` | not layout |\n")
    assert layout_rows(text) == {"testbed/node/": "`launch.py` (gone)", "images/": "the image", "compose/": "the image"}
