"""The domains environments are drawn from (see :mod:`.vocab` for what each field means).

Each line of an entity is its noun synonyms, then its name heads (``person`` for people's names);
each attribute is its column synonyms, then its text values or its integer range.
"""

from __future__ import annotations

from dsv32.synth.programmatic.vocab import PERSON, Attribute, Domain, Entity, check_vocabulary, nouns

_THINGS = ("name", "title", "label")
_PEOPLE = ("name", "full_name", "display_name")


def _entity(words: str, heads: str) -> Entity:
    if heads == "person":
        return Entity(nouns(*words.split()), PERSON, _PEOPLE)
    return Entity(nouns(*words.split()), tuple(heads.split()), _THINGS)


def _text(columns: str, values: str) -> Attribute:
    return Attribute(tuple(columns.split()), tuple(values.split()))


def _number(columns: str, low: int, high: int) -> Attribute:
    return Attribute(tuple(columns.split()), low=low, high=high)


def _domain(name: str, group: tuple, item: tuple, event: tuple, place: tuple, category: tuple,
            measure: tuple, amount: tuple, statuses: str) -> Domain:  # fmt: skip
    open_, done, cancelled = statuses.split()
    return Domain(
        name, _entity(*group), _entity(*item), _entity(*event), _text(*place), _text(*category),
        _number(*measure), _number(*amount), (open_, done, cancelled),
    )  # fmt: skip


DOMAINS: tuple[Domain, ...] = (
    _domain(
        "clinic",
        ("ward care_unit clinic_wing", "Ward Wing Pavilion Annex Unit House"),
        ("physician doctor clinician", "person"),
        ("appointment consultation clinic_visit", "Review Intake Followup Screening"),
        ("floor building wing_side", "North South East West Garden Riverside"),
        ("specialty speciality field", "cardiology dermatology neurology oncology pediatrics radiology"),
        ("fee consult_fee rate", 40, 300),
        ("minutes duration length_minutes", 10, 90),
        "booked attended cancelled",
    ),
    _domain(
        "library",
        ("branch library_branch reading_room", "Branch Library Commons Reading Archive Athenaeum"),
        ("book volume edition", "River Garden Letters Orchard Lantern Compass Harbor Meadow"),
        ("loan checkout borrowing", "Loan Lending Issue Checkout"),
        ("district quarter neighbourhood", "Oldtown Hillside Docklands Uptown Parkside Lakeside"),
        ("genre subject shelf", "mystery history poetry science fantasy biography"),
        ("pages page_count length_pages", 80, 900),
        ("days loan_days duration_days", 3, 30),
        "active returned void",
    ),
    _domain(
        "warehouse",
        ("warehouse depot storage_site", "Depot Yard Hall Store Barn Hangar"),
        ("product stock_item article", "Bolt Bracket Hinge Valve Lamp Hose Clamp Gasket"),
        ("pick_order dispatch stock_transfer", "Pick Transfer Dispatch Move"),
        ("region city zone", "Midlands Coastal Highlands Lowlands Delta Plateau"),
        ("category product_line family", "tools fasteners paint lighting plumbing garden"),
        ("unit_cost cost price", 2, 400),
        ("quantity qty units", 1, 200),
        "pending picked cancelled",
    ),
    _domain(
        "airline",
        ("airport hub air_terminal", "Field Airport Airfield Gateway Aerodrome Port"),
        ("aircraft:aircraft plane airframe", "Falcon Heron Kestrel Osprey Swallow Condor Petrel Gannet"),
        ("flight departure flight_leg", "Shuttle Express Hop Connector"),
        ("country city region", "Norway Chile Kenya Japan Portugal Canada"),
        ("aircraft_type body_class family", "narrowbody widebody regional turboprop freighter jumbo"),
        ("seats seat_count capacity", 50, 400),
        ("passengers pax passenger_count", 20, 350),
        "scheduled landed cancelled",
    ),
    _domain(
        "courses",
        ("faculty academic_program programme", "Faculty Institute College School Academy Center"),
        ("course module class_offering", "Botany Rhetoric Statistics Geology Ethics Acoustics Optics"),
        ("enrollment registration enrolment", "Intake Entry Admission Signup"),
        ("campus site building", "Central Riverside Northgate Eastfield Westbrook Southbank"),
        ("level tier difficulty", "introductory intermediate advanced graduate seminar capstone"),
        ("credits credit_points ects", 2, 12),
        ("tuition fee_paid amount_paid", 100, 900),
        "enrolled completed withdrawn",
    ),
    _domain(
        "payroll",
        ("department cost_center division", "Finance Logistics Research Sales Support Legal"),
        ("employee staff_member worker", "person"),
        ("payslip pay_run paycheck", "Run Cycle Period Payment"),
        ("office city site", "Lisbon Leeds Lyon Lagos Lima Lahore"),
        ("role job_title grade", "analyst engineer manager clerk designer technician"),
        ("salary base_salary annual_salary", 30000, 120000),
        ("gross_pay amount net_pay", 1000, 9000),
        "draft paid voided",
    ),
    _domain(
        "hotel",
        ("hotel inn guesthouse", "Hotel Lodge Inn Resort Retreat Manor"),
        ("room suite guest_room", "Lotus Orchid Iris Jasmine Tulip Dahlia Aster Poppy"),
        ("reservation stay hotel_booking", "Stay Visit Break Getaway"),
        ("city town resort_area", "Sorrento Bruges Kyoto Quebec Cusco Tallinn"),
        ("room_type bed_type view", "single double twin family deluxe studio"),
        ("nightly_rate rate price_per_night", 60, 600),
        ("nights night_count stay_length", 1, 14),
        "confirmed checked_out cancelled",
    ),
    _domain(
        "bike rental",
        ("station bike_dock bike_station", "Station Dock Corner Stand Hub Point"),
        ("bike bicycle cycle", "Comet Arrow Sparrow Rocket Breeze Racer Drifter Glider"),
        ("rental ride hire", "Ride Trip Spin Hire"),
        ("district street neighbourhood", "Canalside Market Hilltop Harbour Old_Mill Fairground"),
        ("bike_type kind style", "city mountain electric cargo road folding"),
        ("gears gear_count frame_size", 1, 27),
        ("ride_minutes duration trip_minutes", 5, 180),
        "active returned cancelled",
    ),
    _domain(
        "theatre",
        ("theatre auditorium playhouse", "Theatre Stage Playhouse Arena Hall Rotunda"),
        ("production play stage_show", "Tempest Mirage Echo Masquerade Reverie Odyssey Gambit"),
        ("performance showing matinee", "Opening Preview Gala Evening"),
        ("city street district", "Westend Broadway Soho Montmartre Trastevere Kreuzberg"),
        ("genre style form", "comedy drama musical opera ballet tragedy"),
        ("ticket_price price base_price", 15, 150),
        ("seats_sold tickets_sold attendance", 20, 800),
        "scheduled performed cancelled",
    ),
    _domain(
        "farm",
        ("field paddock plot", "Field Acre Meadow Paddock Hollow Terrace"),
        ("crop planting crop_bed", "Wheat Barley Lentil Carrot Kale Pumpkin Rye Millet"),
        ("harvest picking yield_record", "Harvest Cut Picking Gathering"),
        ("soil soil_type terrain", "clay loam sandy silt chalk peat"),
        ("crop_family variety species", "grain legume root leafy squash oilseed"),
        ("hectares area acreage", 1, 80),
        ("kilograms yield_kg weight_kg", 50, 5000),
        "planned collected abandoned",
    ),
    _domain(
        "restaurant",
        ("restaurant eatery bistro", "Bistro Kitchen Table Grill Tavern Diner"),
        ("dish menu_item plate", "Risotto Tagine Paella Gnocchi Ramen Gratin Curry Tartare"),
        ("ticket food_order meal_order", "Lunch Dinner Brunch Supper"),
        ("neighbourhood city street", "Chinatown Marais Shoreditch Gracia Belleville Nolita"),
        ("course_type menu_section cuisine", "starter main dessert side soup salad"),
        ("price menu_price cost", 5, 60),
        ("portions servings quantity", 1, 12),
        "open served voided",
    ),
    _domain(
        "gym",
        ("gym fitness_center studio", "Gym Studio Club Loft Arena Forge"),
        ("trainer coach fitness_coach", "person"),
        ("session workout training_session", "Session Class Drill Circuit"),
        ("area district zone", "Harbourfront Midtown Eastside Westside Northside Southside"),
        ("discipline focus specialism", "yoga strength pilates boxing cardio mobility"),
        ("hourly_rate rate price_per_hour", 20, 150),
        ("minutes duration_min session_minutes", 20, 120),
        "booked done cancelled",
    ),
    _domain(
        "museum",
        ("gallery exhibit_hall museum_wing", "Gallery Hall Wing Salon Vault Atrium"),
        ("artwork exhibit piece", "Horizon Nocturne Tide Reverie Bloom Ember Solstice Mosaic"),
        ("tour guided_tour viewing", "Tour Walk Viewing Visit"),
        ("floor level wing", "Ground Mezzanine Upper Lower Garden Tower"),
        ("medium period movement", "oil bronze marble watercolor ceramic textile"),
        ("insured_value valuation value", 1000, 900000),
        ("visitors group_size attendees", 2, 40),
        "scheduled held cancelled",
    ),
    _domain(
        "shipping",
        ("port harbour seaport", "Port Haven Quay Harbour Bay Roads"),
        ("vessel ship freighter", "Albatross Triton Neptune Mariner Voyager Orca Narwhal Tern"),
        ("voyage shipment sailing", "Crossing Passage Run Voyage"),
        ("country coast sea", "Rotterdam Singapore Santos Durban Busan Genoa"),
        ("vessel_class hull_type rig_class", "tanker bulker feeder reefer carrier barge"),
        ("tonnage capacity_tons deadweight", 1000, 90000),
        ("containers teu cargo_units", 10, 900),
        "planned arrived cancelled",
    ),
    _domain(
        "pharmacy",
        ("pharmacy drugstore dispensary", "Pharmacy Apothecary Chemist Dispensary Remedy Cure"),
        ("medicine drug medication", "Calmex Nordol Veracil Lumafen Dorisol Tenzine Quorva Zelora"),
        ("prescription dispensing refill", "Script Refill Order Issue"),
        ("town district street", "Millbrook Ashford Kingsley Thornbury Redhill Elmwood"),
        ("drug_class dosage_form form", "tablet capsule syrup cream inhaler drops"),
        ("unit_price price cost", 2, 200),
        ("doses quantity tablets", 7, 120),
        "pending dispensed cancelled",
    ),
    _domain(
        "car dealer",
        ("dealership showroom car_lot", "Motors Autos Garage Showroom Yard Center"),
        ("car vehicle automobile", "Arrow Meteor Vortex Cruiser Falcon Stallion Dart Phantom"),
        ("sale deal purchase", "Sale Deal Trade Purchase"),
        ("city county town", "Dallas Denver Dayton Dover Duluth Durham"),
        ("body_style segment fuel", "sedan hatchback suv coupe wagon pickup"),
        ("list_price price sticker_price", 8000, 90000),
        ("discount rebate discount_amount", 100, 5000),
        "pending closed cancelled",
    ),
    _domain(
        "school",
        ("homeroom form_group class_group", "Room Form Group Set House Circle"),
        ("pupil learner schoolchild:schoolchildren", "person"),
        ("assessment exam_result test_score", "Quiz Exam Test Paper"),
        ("building floor corridor", "Main Annex Science Arts Library Sports"),
        ("house track stream", "red blue green gold silver bronze"),
        ("age year_level grade_level", 6, 18),
        ("score marks points", 10, 100),
        "scheduled graded excused",
    ),
    _domain(
        "conference",
        ("conference summit symposium:symposia", "Summit Forum Congress Expo Meetup Convention"),
        ("speaker presenter panelist", "person"),
        ("talk presentation keynote", "Talk Lecture Keynote Panel"),
        ("city venue_city host_city", "Vienna Oslo Austin Porto Seoul Zurich"),
        ("track topic theme", "security data cloud design robotics privacy"),
        ("honorarium speaker_fee fee", 100, 3000),
        ("attendees audience headcount", 10, 900),
        "accepted delivered withdrawn",
    ),
    _domain(
        "bakery",
        ("bakery patisserie bakehouse", "Bakery Oven Crust Hearth Loaf Crumb"),
        ("pastry bread baked_good", "Croissant Brioche Focaccia Strudel Eclair Baguette Scone Babka"),
        ("batch bake baking_run", "Batch Bake Run Proof"),
        ("street quarter district", "Rue_Cler Via_Roma Main_Street Market_Row High_Street Mill_Lane"),
        ("dough flour style", "sourdough rye brioche puff shortcrust choux"),
        ("price unit_price sale_price", 1, 40),
        ("units loaves pieces", 6, 200),
        "planned baked discarded",
    ),
    _domain(
        "zoo",
        ("enclosure habitat animal_house", "Enclosure Habitat Lagoon Savanna Grove Burrow"),
        ("animal creature zoo_animal", "Mango Pepper Biscuit Nimbus Juniper Pebble Saffron Tofu"),
        ("feeding vet_visit health_check", "Feeding Check Visit Round"),
        ("zone area trail", "Africa Asia Arctic Rainforest Outback Wetland"),
        ("species diet animal_class", "lion zebra otter penguin giraffe lemur"),
        ("weight_kg weight body_mass", 2, 5000),
        ("food_kg ration portion_kg", 1, 80),
        "scheduled done skipped",
    ),
    _domain(
        "winery",
        ("vineyard estate winery", "Estate Vineyard Cellars Domaine Hills Slopes"),
        ("wine vintage cuvee", "Reserve Cuvee Blend Rosso Blanc Noir Classic Solera"),
        ("tasting cellar_sale bottling", "Tasting Sale Bottling Release"),
        ("region valley appellation", "Douro Rioja Mosel Napa Barossa Tokaj"),
        ("grape varietal grape_variety", "merlot riesling syrah malbec chardonnay pinot"),
        ("bottle_price price cellar_price", 8, 250),
        ("bottles cases bottle_count", 6, 600),
        "planned completed cancelled",
    ),
    _domain(
        "marina",
        ("marina pier jetty", "Marina Pier Jetty Wharf Landing Mooring"),
        ("boat yacht sailboat", "Seabird Driftwood Bluefin Windrose Starling Kelp Mistral Coho"),
        ("mooring berth_booking charter", "Berth Charter Mooring Stay"),
        ("coast bay shore", "Amalfi Algarve Dalmatia Brittany Cornwall Cyclades"),
        ("rig boat_type propulsion", "sloop ketch catamaran trawler dinghy schooner"),
        ("length_ft hull_length loa", 15, 120),
        ("berth_nights days night_stays", 1, 21),
        "reserved departed cancelled",
    ),
    _domain(
        "cinema",
        ("cinema multiplex screening_room", "Cinema Picturehouse Odeon Screen Palace Lumiere"),
        ("film movie feature", "Nightfall Paper_Moon Iron_Coast Glass_River Long_Summer Red_Tide"),
        ("screening showtime projection", "Screening Premiere Matinee Late_Show"),
        ("neighbourhood city quarter", "Camden Kreuzberg Belleville Gion Palermo Trastevere"),
        ("rating certificate film_genre", "documentary thriller animation western romance noir"),
        ("runtime running_time length_minutes", 70, 200),
        ("tickets admissions seats_taken", 5, 400),
        "scheduled screened cancelled",
    ),
)

check_vocabulary(DOMAINS)
DOMAIN_NAMES = tuple(d.name for d in DOMAINS)
BY_NAME = {d.name: d for d in DOMAINS}
