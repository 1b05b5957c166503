"""The words the prompt generator (`dflash.recipe.prompt_gen`) fills its templates with.

Subjects come in families, most of them composed from parts (a sentence to rewrite is a
who, a deed and a when; a list is ways to reach a goal, or things from a country), so a
set of a thousand prompts rarely asks about one subject twice: a drafter trained on
replies to a few dozen subjects recalls them instead of learning to draft (copying
from the prompt, reading the target's context). Every list here is a subject's part and
is split by `prompt_gen.subjects`; the ways of asking (styles, audiences, languages)
live in prompt_gen.
"""

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun",
         "Kofi", "Lena", "Mateo", "Nina", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tomas"]
ITEMS = ["apples", "books", "pencils", "stamps", "marbles", "cookies", "tickets", "shells",
         "stickers", "coins", "cards", "buttons", "eggs", "bottles", "plants", "candles"]
TOPICS = ["why the sky is blue", "how a bicycle stays upright", "what a prime number is",
          "how vaccines work", "why ice floats", "what inflation is", "how rainbows form",
          "what a hash table is", "why leaves change colour", "how a compiler works",
          "how the heart pumps blood", "what photosynthesis does", "how a battery stores energy",
          "why the moon has phases", "what a neural network is", "how tides work",
          "what an API is", "why bread rises", "how an airplane wing makes lift",
          "what recursion is", "how earthquakes happen", "what a black hole is",
          "how interest on a loan works", "why we have seasons", "what DNA does",
          "how a refrigerator keeps food cold", "what encryption is", "how sound travels",
          "why metal feels colder than wood", "what a database index is",
          "how a solar panel makes electricity", "what a volcano is",
          "how the internet routes data", "why the ocean is salty",
          "what a currency exchange rate is", "how muscles grow", "how a thermostat works",
          "why cats purr", "what gravity does", "how a search engine ranks pages"]
SENTENCES = ["the meeting was moved to friday because the room was booked",
             "our team finished the project early and under budget",
             "the train was late so we missed the first half of the film",
             "she fixed the bug after reading the logs for an hour",
             "the new library opens next month with longer hours",
             "he forgot his umbrella and got soaked on the way home",
             "the company will hire ten engineers this spring",
             "we cancelled the picnic because of the storm warning",
             "the recipe needs two cups of flour and a pinch of salt",
             "my neighbour has been learning to play the violin",
             "the report was sent to the client before the deadline",
             "they painted the kitchen a bright shade of yellow",
             "the museum is free for students on sundays",
             "our flight was delayed by three hours at the airport",
             "the children planted tomatoes in the school garden",
             "the software update fixed the battery drain on older phones",
             "the bakery on the corner sells fresh bread every morning",
             "the bus driver waited for the last passenger to board",
             "our manager approved the budget for the new laptops",
             "the river flooded the fields after a week of heavy rain",
             "my sister finished her first marathon in four hours",
             "the council will repair the road before winter",
             "the students presented their science project to the parents",
             "the printer ran out of paper during the exam",
             "we booked a table by the window for seven people",
             "the old bridge will be closed for repairs until may",
             "the dog barked at the mail carrier every morning",
             "the hotel upgraded our room because the lift was broken",
             "the team lost the final after a penalty shootout",
             "the lab results will be ready on thursday afternoon",
             "he sold his car and now rides a bicycle to work",
             "the store offers free delivery on orders over fifty dollars"]
LISTS = ["fruits that are red", "countries in South America", "ways to save energy at home",
         "programming languages", "musical instruments", "tips for a job interview",
         "animals that live in the ocean", "board games for a family evening",
         "healthy breakfast ideas", "famous scientists", "things to pack for a camping trip",
         "ways to reduce stress", "vegetables that grow underground", "European capitals",
         "hobbies you can do indoors", "parts of a computer", "birds found in cities",
         "questions to ask a new landlord", "sports played with a ball",
         "uses for a spreadsheet", "kitchen tools every cook needs", "rivers in Africa",
         "ways to learn a new language", "safety rules for a science lab",
         "cities in Asia", "flowers that bloom in spring", "ways to stay focused while studying",
         "tools for a home workshop", "famous painters", "mammals that can swim",
         "ingredients for a simple salad", "ways to make a small room feel bigger",
         "types of clouds", "desserts from France", "jobs that involve travel",
         "reasons to keep a journal", "materials that conduct electricity", "winter sports",
         "apps that help with productivity", "ways to cut down on sugar"]
CODE = ["reverses a string", "checks whether a number is prime", "returns the largest of a "
        "list of numbers", "counts the vowels in a string", "computes the factorial of n",
        "merges two sorted lists", "removes duplicates from a list",
        "checks whether a string is a palindrome", "returns the n-th Fibonacci number",
        "sums the digits of an integer", "converts Celsius to Fahrenheit",
        "finds the second smallest number in a list", "counts the words in a sentence",
        "returns the greatest common divisor of two numbers",
        "checks whether a year is a leap year", "capitalizes the first letter of each word",
        "returns the average of a list of numbers", "checks whether two strings are anagrams",
        "counts how often each character appears in a string",
        "finds an item in a sorted list by binary search",
        "converts a number of seconds to hours and minutes",
        "returns the even numbers of a list", "reverses the order of words in a sentence",
        "checks whether a list is sorted"]

# composed subjects: every part is split on its own, so a held-out subject is made of
# held-out parts only
WHO = ["the new manager", "my neighbour", "our team", "the city council", "a local bakery",
       "the head nurse", "my grandfather", "the school principal", "the delivery driver",
       "our landlord", "the youth orchestra", "a group of volunteers", "the football coach",
       "the airline", "my cousin", "the museum curator", "the night shift",
       "the software team", "the mayor", "a young farmer", "the library staff",
       "the tour guide", "our accountant", "the chess club", "the fire brigade",
       "the new intern", "the hotel chef", "my best friend", "the research lab",
       "the bus company"]
DID = ["cancelled the weekly meeting", "painted the front door green", "opened a second shop",
       "fixed the broken heater", "raised the price of tickets", "planted a row of apple trees",
       "won the regional contest", "moved into a bigger office",
       "lost the keys to the storeroom", "finished the annual report",
       "hired two new assistants", "sold the old van", "launched a new website",
       "repaired the leaking roof", "postponed the summer festival",
       "changed the opening hours", "donated books to the school",
       "found a mistake in the invoice", "booked a trip to the coast",
       "replaced the old computers", "wrote a letter of complaint", "organised a charity run",
       "closed the car park", "baked bread for the whole street",
       "tested the new alarm system", "signed a contract with a supplier",
       "rebuilt the garden wall", "started recycling all paper",
       "answered every customer email", "trained three new volunteers"]
WHEN = ["last week", "before the deadline", "after the storm", "on sunday morning",
        "because the budget was cut", "despite the heavy rain", "during the holidays",
        "without telling anyone", "for the first time in years", "after a long discussion",
        "earlier than planned", "at the end of the month", "because of a power cut",
        "while the boss was away", "in just two days", "after several complaints",
        "to save money", "before the inspection", "on a cold winter night", "as a surprise"]
GOALS = ["save money on groceries", "sleep better", "keep a houseplant alive",
         "make friends in a new city", "prepare for an exam", "stay warm in winter",
         "reduce plastic waste", "improve your handwriting", "move more during a desk job",
         "keep a kitchen clean", "speed up a slow computer", "learn to cook",
         "motivate a team", "spend less time on your phone", "welcome a new colleague",
         "plan a birthday party", "save water in the garden", "protect your privacy online",
         "start running", "read more books", "keep children busy on a rainy day",
         "make a long flight comfortable", "prepare for a storm",
         "organise a small wardrobe", "write a clearer email", "remember names",
         "cool a room without air conditioning", "celebrate a small win",
         "travel on a tight budget", "care for an old dog"]
PEOPLE = ["traditional dishes", "famous writers", "well-known musicians", "famous inventors",
          "famous athletes", "film directors", "famous painters"]
COUNTRIES = ["Japan", "Brazil", "India", "Italy", "Egypt", "Canada", "Mexico", "Nigeria",
             "Greece", "Sweden", "Korea", "Peru", "Turkey", "Spain", "Kenya"]
DEVICES = ["a microwave oven", "a smoke detector", "a washing machine", "an electric car",
           "a GPS receiver", "a touch screen", "a wind turbine", "a camera lens",
           "a heat pump", "a credit card chip", "a hydraulic brake",
           "a noise-cancelling headset", "a 3D printer", "an elevator", "a water filter",
           "a pressure cooker", "a barcode scanner", "a hearing aid", "a traffic light",
           "an electric kettle", "a dishwasher", "a jet engine", "a quartz watch",
           "a vacuum cleaner", "a submarine", "a parachute", "a light bulb", "a thermometer",
           "a lock and key", "a mobile phone network"]
CONCEPTS = ["a mortgage", "an algorithm", "a carbon footprint", "a stock market index",
            "a placebo", "an ecosystem", "a budget deficit", "a firewall", "a metaphor",
            "a supply chain", "an antibody", "a time zone", "a greenhouse gas",
            "a compiler warning", "an opinion poll", "a vaccine booster",
            "a spreadsheet formula", "a food chain", "a patent", "a credit score", "a tariff",
            "a gene", "an operating system", "a weather front", "a pension", "an atom",
            "a copyright", "a renewable resource", "peer review", "a cloud server"]
STATS = ["sum", "median", "product", "range", "mode", "standard deviation",
         "number of negative values", "sum of the squares",
         "largest gap between neighbours", "second largest value"]
PROPS = ["contains only digits", "starts with a capital letter", "has balanced parentheses",
         "is a valid hexadecimal number", "contains every vowel", "ends with a question mark",
         "has no repeated characters", "is a valid time like 12:45",
         "reads the same backwards ignoring spaces", "contains a number"]
UNITS = ["kilometres to miles", "kilograms to pounds", "minutes to seconds",
         "a binary string to an integer", "an integer to a Roman numeral",
         "a date from DD/MM/YYYY to YYYY-MM-DD", "a sentence to title case",
         "litres to gallons", "an RGB colour to a hex string", "a temperature in Kelvin to Celsius"]
